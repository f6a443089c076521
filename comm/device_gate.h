// Private (CUDA builds): the gate kernel and the flag kernels of
// comm/device.h, launched from host code that g++ compiles.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace braid::comm {

// Queues on `stream` one thread that returns once *gate >= ticket, or after
// `timeout_ns` of waiting, then writing 1 to *timed_out.
cudaError_t launch_gate(cudaStream_t stream, const volatile std::uint64_t* gate, std::uint64_t ticket,
                        std::uint64_t timeout_ns, std::uint32_t* timed_out);

// Gate `flag` (comm/algorithms/direct.h, "Stream order by flags"). Each
// rank's block, in its device memory: kMaxFlagRanks words `begun` (word r:
// the last call whose first kernel rank r's stream has reached), as many
// `ended` (the last call whose share rank r has written), and `gave_up`.
inline constexpr int kMaxFlagRanks = 8;
inline constexpr std::size_t kFlagBlockBytes = (2 * kMaxFlagRanks + 1) * sizeof(std::uint64_t);

// Every rank's block as this rank's kernels address it (block[me]: its own).
struct FlagBlocks {
  std::uint64_t* block[kMaxFlagRanks] = {};
  int n = 0, me = 0;
};

// Queues on `stream` one thread that writes `call` into word `begun[me]` of
// every other rank's block (flag_begin) or `ended[me]` (flag_end, after a
// fence: the share the kernels before it wrote is visible first), then
// waits until its own block's word of every other rank holds `call` or
// more. After `timeout_ns` of waiting it gives up: writes 1 to *timed_out
// (mapped host memory, for the host) and to its block's `gave_up`, after
// which this rank's flag kernels no longer wait (the results are wrong, and
// the host says so).
cudaError_t launch_flag_begin(cudaStream_t stream, const FlagBlocks& blocks, std::uint64_t call,
                              std::uint64_t timeout_ns, std::uint32_t* timed_out);
cudaError_t launch_flag_end(cudaStream_t stream, const FlagBlocks& blocks, std::uint64_t call,
                            std::uint64_t timeout_ns, std::uint32_t* timed_out);

}  // namespace braid::comm
