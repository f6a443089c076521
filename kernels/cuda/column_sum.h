// Private to kernels/cuda: deterministic column sums over rows, for the bias
// and LayerNorm parameter gradients. A block of 32 x 8 threads owns 32
// columns; thread (x, y) adds rows y, y + 8, ... in order, then the 8
// partial sums are combined in a fixed order. No atomics, so the result is
// the same from run to run. Reads are coalesced: consecutive x, consecutive
// addresses.
#pragma once

#include <cstddef>

namespace braid::kernels::cuda::detail {

inline constexpr int kColumnsPerBlock = 32;
inline constexpr int kRowStripes = 8;

// sums[c] += sum over rows r of value(r, c), for c < C and r < N.
template <typename Value>
__device__ void column_sum(float* sums, int N, int C, Value value) {
  __shared__ float partial[kRowStripes][kColumnsPerBlock];
  int c = blockIdx.x * kColumnsPerBlock + threadIdx.x;
  float acc = 0.f;
  if (c < C)
    for (int r = threadIdx.y; r < N; r += kRowStripes) acc += value(r, c);
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.f;
    for (int y = 0; y < kRowStripes; ++y) total += partial[y][threadIdx.x];
    sums[c] += total;
  }
}

inline dim3 column_sum_grid(int C) { return dim3((C + kColumnsPerBlock - 1) / kColumnsPerBlock); }
inline dim3 column_sum_block() { return dim3(kColumnsPerBlock, kRowStripes); }

}  // namespace braid::kernels::cuda::detail
