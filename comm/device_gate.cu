// The gate of comm/device.h: holds a stream until the host opens it.
#include "comm/device_gate.h"

namespace braid::comm {
namespace {

__device__ std::uint64_t global_timer_ns() {
  std::uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

// One thread polls the counter in mapped host memory, sleeping between reads
// so that it takes almost nothing from the kernels beside it.
__global__ void gate_kernel(const volatile std::uint64_t* gate, std::uint64_t ticket, std::uint64_t timeout_ns,
                            std::uint32_t* timed_out) {
  const std::uint64_t start = global_timer_ns();
  unsigned pause = 64;
  while (*gate < ticket) {
    if (global_timer_ns() - start > timeout_ns) {
      *timed_out = 1;
      __threadfence_system();
      return;
    }
    __nanosleep(pause);
    if (pause < 8192) pause *= 2;
  }
}

}  // namespace

cudaError_t launch_gate(cudaStream_t stream, const volatile std::uint64_t* gate, std::uint64_t ticket,
                        std::uint64_t timeout_ns, std::uint32_t* timed_out) {
  gate_kernel<<<1, 1, 0, stream>>>(gate, ticket, timeout_ns, timed_out);
  return cudaGetLastError();
}

}  // namespace braid::comm
