// Linear layer (out = inp @ weight^T + bias) through cuBLAS sgemm; the same
// three products as kernels/cpu/matmul.cc, with weight stored [OC, C]:
//   forward  out     = inp  @ weight^T   (N x C) (OC x C)^T
//   backward dinp   += dout @ weight     (N x OC) (OC x C)
//            dweight += dout^T @ inp     (OC x N) (N x C)
// The bias is broadcast into `out` first and the sgemm accumulates onto it
// (beta = 1). dbias is a deterministic column sum of dout.
#include "kernels/cuda/blas.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/column_sum.h"
#include "kernels/cuda/gpt_ops.h"

namespace braid::kernels::cuda {
namespace {

__global__ void broadcast_rows_kernel(float* out, const float* row, int N, int OC) {
  std::size_t count = std::size_t(N) * OC;
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    out[i] = row[i % OC];
}

struct Element {
  const float* matrix;
  int columns;
  __device__ float operator()(int r, int c) const { return matrix[std::size_t(r) * columns + c]; }
};

__global__ void bias_backward_kernel(float* dbias, const float* dout, int N, int OC) {
  detail::column_sum(dbias, N, OC, Element{dout, OC});
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int N, int C, int OC, cudaStream_t stream) {
  float beta = 0.f;
  if (bias != nullptr && N > 0 && OC > 0) {
    broadcast_rows_kernel<<<detail::grid_for(std::size_t(N) * OC), detail::kThreads, 0, stream>>>(
        out, bias, N, OC);
    detail::check_launch("broadcast_rows_kernel");
    beta = 1.f;
  }
  detail::gemm_row_major(stream, false, true, N, OC, C, 1.f, inp, C, 0, weight, C, 0, beta,
                         out, OC, 0);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC,
                     cudaStream_t stream) {
  if (dinp != nullptr)
    detail::gemm_row_major(stream, false, false, N, C, OC, 1.f, dout, OC, 0, weight, C, 0, 1.f,
                           dinp, C, 0);
  detail::gemm_row_major(stream, true, false, OC, C, N, 1.f, dout, OC, 0, inp, C, 0, 1.f,
                         dweight, C, 0);
  if (dbias != nullptr && OC > 0) {
    bias_backward_kernel<<<detail::column_sum_grid(OC), detail::column_sum_block(), 0, stream>>>(
        dbias, dout, N, OC);
    detail::check_launch("bias_backward_kernel");
  }
}

}  // namespace braid::kernels::cuda
