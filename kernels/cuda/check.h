// Private to kernels/cuda: turns a failed CUDA runtime call into an
// exception that names the call. kernels/ depends on nothing else of ours, so
// this is std::runtime_error; comm/ and runtime/ wrap it into their own error
// hierarchy where they catch it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace braid::kernels::cuda::detail {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("braid kernels: ") + what + " failed: " +
                             cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

// After a kernel launch: reports a bad launch configuration at once (errors
// raised while the kernel runs surface at the next synchronising call).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// Blocks of kThreads threads covering `count` work items, capped so that the
// grid-stride loops in the kernels take over for very large counts.
inline constexpr int kThreads = 256;
inline unsigned grid_for(std::size_t count, std::size_t cap = 65535) {
  std::size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks < cap ? blocks : cap));
}

}  // namespace braid::kernels::cuda::detail
