// LayerNorm over the last dimension, eps 1e-5, biased variance: the math of
// kernels/cpu/layernorm.cc (read it for the formulas).
//
// Forward: one warp per row. Mean, then the variance from a second pass over
// (x - mean), then the output; the row is re-read from memory (L1/L2) rather
// than held in registers, so any C works.
// Backward: one warp per row for dinp; dweight and dbias are column sums over
// rows (column_sum.h), deterministic without atomics.
#include "kernels/cuda/check.h"
#include "kernels/cuda/column_sum.h"
#include "kernels/cuda/gpt_ops.h"
#include "kernels/cuda/warp.h"

namespace braid::kernels::cuda {
namespace {

using detail::kWarp;
using detail::warp_sum;

constexpr float kEps = 1e-5f;
constexpr int kRowsPerBlock = 8;  // warps per block

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int N, int C) {
  int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (n >= N) return;
  const float* x = inp + std::size_t(n) * C;
  float* y = out + std::size_t(n) * C;
  float sum = 0.f;
  for (int i = lane; i < C; i += kWarp) sum += x[i];
  float m = warp_sum(sum) / float(C);
  float sq = 0.f;
  for (int i = lane; i < C; i += kWarp) sq += (x[i] - m) * (x[i] - m);
  float s = rsqrtf(warp_sum(sq) / float(C) + kEps);
  for (int i = lane; i < C; i += kWarp) y[i] = (x[i] - m) * s * weight[i] + bias[i];
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

__global__ void layernorm_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                      const float* weight, const float* mean, const float* rstd,
                                      int N, int C) {
  int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (n >= N) return;
  const float* x = inp + std::size_t(n) * C;
  const float* dy = dout + std::size_t(n) * C;
  float* dx = dinp + std::size_t(n) * C;
  float m = mean[n], s = rstd[n];
  float g_sum = 0.f, gx_sum = 0.f;
  for (int i = lane; i < C; i += kWarp) {
    float g = dy[i] * weight[i];
    g_sum += g;
    gx_sum += g * (x[i] - m) * s;
  }
  float g_mean = warp_sum(g_sum) / float(C), gx_mean = warp_sum(gx_sum) / float(C);
  for (int i = lane; i < C; i += kWarp) {
    float xhat = (x[i] - m) * s;
    dx[i] += s * (dy[i] * weight[i] - g_mean - xhat * gx_mean);
  }
}

// dout * xhat at (r, c), recomputing xhat from the saved statistics.
struct DoutXhat {
  const float *dout, *inp, *mean, *rstd;
  int C;
  __device__ float operator()(int r, int c) const {
    std::size_t i = std::size_t(r) * C + c;
    return dout[i] * (inp[i] - mean[r]) * rstd[r];
  }
};
struct Dout {
  const float* dout;
  int C;
  __device__ float operator()(int r, int c) const { return dout[std::size_t(r) * C + c]; }
};

__global__ void layernorm_params_kernel(float* dweight, float* dbias, const float* dout,
                                        const float* inp, const float* mean, const float* rstd,
                                        int N, int C) {
  detail::column_sum(dweight, N, C, DoutXhat{dout, inp, mean, rstd, C});
  __syncthreads();  // column_sum's shared buffer is reused
  detail::column_sum(dbias, N, C, Dout{dout, C});
}

unsigned row_blocks(int N) { return unsigned((N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C,
                       cudaStream_t stream) {
  if (N == 0) return;
  layernorm_forward_kernel<<<row_blocks(N), kRowsPerBlock * kWarp, 0, stream>>>(
      out, mean, rstd, inp, weight, bias, N, C);
  detail::check_launch("layernorm_forward_kernel");
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C, cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  layernorm_dinp_kernel<<<row_blocks(N), kRowsPerBlock * kWarp, 0, stream>>>(
      dinp, dout, inp, weight, mean, rstd, N, C);
  detail::check_launch("layernorm_dinp_kernel");
  layernorm_params_kernel<<<detail::column_sum_grid(C), detail::column_sum_block(), 0, stream>>>(
      dweight, dbias, dout, inp, mean, rstd, N, C);
  detail::check_launch("layernorm_params_kernel");
}

}  // namespace braid::kernels::cuda
