// The gate of comm/device.h, which holds a stream until the host opens it,
// and gate `flag`'s kernels, which hold it until the other ranks' streams
// have reached the same point (comm/device_gate.h).
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

// The flag kernels: one thread tells every other rank's block, then waits
// for its own (comm/device_gate.h). `word` is 0 (begun) or kMaxFlagRanks (ended).
__global__ void flag_kernel(FlagBlocks b, int word, std::uint64_t call, std::uint64_t timeout_ns,
                            std::uint32_t* timed_out) {
  if (b.n < 2) return;  // no peers (and preload_kernels's launch)
  std::uint64_t* mine = b.block[b.me];
  volatile std::uint64_t* gave_up = mine + 2 * kMaxFlagRanks;
  __threadfence();  // what this stream's kernels wrote before, seen before the flag
  for (int r = 0; r < b.n; ++r)
    if (r != b.me) atomicMax(reinterpret_cast<unsigned long long*>(b.block[r] + word + b.me), call);
  if (*gave_up != 0) return;
  const std::uint64_t start = global_timer_ns();
  for (int r = 0; r < b.n; ++r) {
    if (r == b.me) continue;
    const volatile std::uint64_t* theirs = mine + word + r;
    while (*theirs < call) {
      if (global_timer_ns() - start > timeout_ns) {
        *gave_up = 1;
        *timed_out = 1;
        __threadfence_system();
        return;
      }
      __nanosleep(32);  // one thread: a short pause keeps the hand-off at about a microsecond
    }
  }
  __threadfence();  // what the other ranks wrote before their flags, seen by the kernels after this one
}

}  // namespace

cudaError_t launch_flag_begin(cudaStream_t stream, const FlagBlocks& blocks, std::uint64_t call,
                              std::uint64_t timeout_ns, std::uint32_t* timed_out) {
  flag_kernel<<<1, 1, 0, stream>>>(blocks, 0, call, timeout_ns, timed_out);
  return cudaGetLastError();
}

cudaError_t launch_flag_end(cudaStream_t stream, const FlagBlocks& blocks, std::uint64_t call,
                            std::uint64_t timeout_ns, std::uint32_t* timed_out) {
  flag_kernel<<<1, 1, 0, stream>>>(blocks, kMaxFlagRanks, call, timeout_ns, timed_out);
  return cudaGetLastError();
}

cudaError_t launch_gate(cudaStream_t stream, const volatile std::uint64_t* gate, std::uint64_t ticket,
                        std::uint64_t timeout_ns, std::uint32_t* timed_out) {
  gate_kernel<<<1, 1, 0, stream>>>(gate, ticket, timeout_ns, timed_out);
  return cudaGetLastError();
}

}  // namespace braid::comm
