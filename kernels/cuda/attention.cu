// Causal multi-head self-attention over a fused qkv activation; the math and
// layout of kernels/cpu/attention.cc (read it for the formulas). Q, K and V of
// a head are strided views into qkv (row stride 3C), so no copies are made.
//
// Each product runs for one batch entry as one cuBLAS strided-batched sgemm
// over the NH heads (head h of Q starts HS floats after head h-1; its [T, T]
// block of att starts T*T floats after). The products are full T x T: the
// masked upper triangle of att and dP is exactly 0, so it adds nothing, and
// the CPU's causal blocking is an optimisation this version leaves out.
//   forward   att = softmax_causal(scale * Q K^T);  out = att V
//   backward  dA = dout V^T;  dP = att * (dA - rowsum(att * dA)) * scale;
//             dQ += dP K;  dK += dP^T Q;  dV += att^T dout
// The softmax and its backward are one warp per row of T scores.
#include <cmath>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/gpt_ops.h"
#include "kernels/cuda/warp.h"

namespace braid::kernels::cuda {
namespace {

using detail::gemm_row_major;
using detail::kWarp;

constexpr int kRowsPerBlock = 8;  // warps per block

// Row r of `rows` rows of T scores, query position t = r % T: softmax over
// the t + 1 visible entries, zero the rest.
__global__ void softmax_causal_kernel(float* att, int rows, int T) {
  int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  float* row = att + std::size_t(r) * T;
  int visible = r % T + 1;
  float max = -INFINITY;
  for (int j = lane; j < visible; j += kWarp) max = fmaxf(max, row[j]);
  max = detail::warp_max(max);
  float sum = 0.f;
  for (int j = lane; j < visible; j += kWarp) {
    float e = expf(row[j] - max);
    row[j] = e;
    sum += e;
  }
  float inv = 1.f / detail::warp_sum(sum);
  for (int j = lane; j < T; j += kWarp) row[j] = j < visible ? row[j] * inv : 0.f;
}

// dA -> dP in place, row by row, against the saved probabilities.
__global__ void softmax_causal_backward_kernel(float* dp, const float* att, int rows, int T,
                                               float scale) {
  int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  float* drow = dp + std::size_t(r) * T;
  const float* arow = att + std::size_t(r) * T;
  int visible = r % T + 1;
  float dot = 0.f;
  for (int j = lane; j < visible; j += kWarp) dot += arow[j] * drow[j];
  dot = detail::warp_sum(dot);
  for (int j = lane; j < T; j += kWarp) drow[j] = j < visible ? arow[j] * (drow[j] - dot) * scale : 0.f;
}

unsigned row_blocks(std::size_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

// Offsets of batch entry b, as HeadView in the CPU version (head 0; the
// sgemm batch strides step through the heads).
struct BatchView {
  std::size_t qkv, out, att;
};
BatchView batch_view(int b, int T, int NH, int HS) {
  std::size_t C = std::size_t(NH) * HS;
  return {std::size_t(b) * T * 3 * C, std::size_t(b) * T * C, std::size_t(b) * NH * T * T};
}

// Stream-ordered scratch memory, freed on the same stream when it goes out of
// scope (also when a cuBLAS call throws).
struct Scratch {
  Scratch(std::size_t bytes, cudaStream_t stream) : stream(stream) {
    detail::check(cudaMallocAsync(reinterpret_cast<void**>(&data), bytes, stream),
                  "cudaMallocAsync (attention scratch)");
  }
  ~Scratch() { cudaFreeAsync(data, stream); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* data = nullptr;
  cudaStream_t stream;
};

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS,
                       cudaStream_t stream) {
  const int C = NH * HS, C3 = 3 * C;
  const long long TT = (long long)T * T;
  const float scale = 1.f / std::sqrt(float(HS));
  std::size_t rows = std::size_t(B) * NH * T;
  if (rows == 0) return;
  for (int b = 0; b < B; ++b) {
    BatchView view = batch_view(b, T, NH, HS);
    const float* q = qkv + view.qkv;
    gemm_row_major(stream, false, true, T, T, HS, scale, q, C3, HS, q + C, C3, HS, 0.f,
                   att + view.att, T, TT, NH);
  }
  softmax_causal_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, stream>>>(att, int(rows), T);
  detail::check_launch("softmax_causal_kernel");
  for (int b = 0; b < B; ++b) {
    BatchView view = batch_view(b, T, NH, HS);
    gemm_row_major(stream, false, false, T, HS, T, 1.f, att + view.att, T, TT,
                   qkv + view.qkv + 2 * C, C3, HS, 0.f, out + view.out, C, HS, NH);
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        int B, int T, int NH, int HS, cudaStream_t stream) {
  const int C = NH * HS, C3 = 3 * C;
  const long long TT = (long long)T * T;
  const float scale = 1.f / std::sqrt(float(HS));
  std::size_t rows = std::size_t(NH) * T;  // of one batch entry
  if (B == 0 || rows == 0) return;
  Scratch scratch(sizeof(float) * NH * TT, stream);
  float* dp = scratch.data;  // [NH, T, T]: dA, then dP in place; reused for every b
  for (int b = 0; b < B; ++b) {
    BatchView view = batch_view(b, T, NH, HS);
    const float* q = qkv + view.qkv;
    const float *k = q + C, *v = q + 2 * C;
    float* dq = dqkv + view.qkv;
    float *dk = dq + C, *dv = dq + 2 * C;
    const float* a = att + view.att;
    const float* dout_b = dout + view.out;
    gemm_row_major(stream, false, true, T, T, HS, 1.f, dout_b, C, HS, v, C3, HS, 0.f, dp, T, TT, NH);
    softmax_causal_backward_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, stream>>>(
        dp, a, int(rows), T, scale);
    detail::check_launch("softmax_causal_backward_kernel");
    gemm_row_major(stream, false, false, T, HS, T, 1.f, dp, T, TT, k, C3, HS, 1.f, dq, C3, HS, NH);
    gemm_row_major(stream, true, false, T, HS, T, 1.f, dp, T, TT, q, C3, HS, 1.f, dk, C3, HS, NH);
    gemm_row_major(stream, true, false, T, HS, T, 1.f, a, T, TT, dout_b, C, HS, 1.f, dv, C3, HS, NH);
  }
}

}  // namespace braid::kernels::cuda
