// tools/bench/device.h without CUDA.
#include "tools/bench/device.h"

#include "runtime/errors.h"

namespace braid::comm::bench_device {

void init(int) { throw InvalidUsage("--device cuda needs a braid built with CUDA (nvcc found at configure time)"); }
void* stream() { return nullptr; }
std::byte* allocate(std::size_t) { return nullptr; }
void release(std::byte*) {}
void upload(std::byte*, const std::byte*, std::size_t) {}
void download(std::byte*, const std::byte*, std::size_t) {}
void synchronize(bool) {}
double measure_copy_gbps(std::size_t) { return 0.0; }

}  // namespace braid::comm::bench_device
