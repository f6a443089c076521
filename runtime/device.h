// Where a buffer lives: host memory or a CUDA device's memory.
//
// locate() asks the CUDA driver (cuPointerGetAttribute) when the driver is
// already loaded in this process: a pointer into device memory can only
// exist after something (braid's own CUDA code, PyTorch, ...) loaded it. The
// driver is looked up at run time (dlopen with RTLD_NOLOAD), never linked,
// so a build without CUDA still recognises a device pointer handed to it and
// refuses it by name instead of reading it as host memory, and a process
// that never touched CUDA pays one failed lookup, once.
//
// Managed (unified) memory is reported as host memory: the CPU may read and
// write it directly.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace braid::runtime {

enum class MemoryKind { host, device };

struct Location {
  MemoryKind kind = MemoryKind::host;
  int device = -1;  // the CUDA device ordinal for device memory
  // Device memory: the allocation the pointer lies in (what CUDA IPC shares).
  const void* base = nullptr;
  std::size_t size = 0;
};

// "host memory", "CUDA device 1 memory".
std::string describe(const Location& location);

Location locate(const void* pointer);

// False while no CUDA driver is loaded in this process and no test locator
// is set: every pointer is then host memory, and a call with two buffers
// need not ask locate() twice (one look at the loader, a few ns).
bool device_memory_possible();

// Whether this build has braid's CUDA support (-Dcuda found nvcc).
bool cuda_built();

// Tests: replaces the driver lookup (nullptr restores it). Lets the
// validation of device buffers be tested where no GPU exists.
void set_locator_for_testing(std::function<Location(const void*)> locator);

}  // namespace braid::runtime
