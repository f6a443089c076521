// Private to kernels/cuda: warp- and block-wide sums and maxima through
// shuffles. Every lane (thread) gets the result. The combining order is
// fixed by the lane layout, so results repeat exactly from run to run.
#pragma once

namespace braid::kernels::cuda::detail {

inline constexpr int kWarp = 32;

__device__ inline float warp_sum(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ inline float warp_max(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Block-wide versions; blockDim.x must be a multiple of 32 (at most 1024)
// and every thread of the block must call them.
__device__ inline float block_sum(float x) {
  __shared__ float per_warp[kWarp];
  int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  x = warp_sum(x);
  __syncthreads();
  if (lane == 0) per_warp[warp] = x;
  __syncthreads();
  return warp_sum(lane < warps ? per_warp[lane] : 0.f);
}

__device__ inline float block_max(float x) {
  __shared__ float per_warp[kWarp];
  int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) per_warp[warp] = x;
  __syncthreads();
  return warp_max(lane < warps ? per_warp[lane] : per_warp[0]);
}

}  // namespace braid::kernels::cuda::detail
