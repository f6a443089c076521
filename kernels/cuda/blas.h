// Private to kernels/cuda: the cuBLAS handle and a row-major strided-batched
// sgemm, shared by matmul.cu and attention.cu.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace braid::kernels::cuda::detail {

// The calling thread's handle for the current device, bound to `stream`.
// Created on first use with CUBLAS_DEFAULT_MATH (full fp32, no TF32) and
// kept for the life of the thread: handles are not thread-safe to share, and
// destroying one at exit can race the driver's own teardown.
cublasHandle_t cublas_handle(cudaStream_t stream);

// Row-major C = alpha op(A) op(B) + beta C for `batch` matrices at the given
// element strides; op(A) is M x K, op(B) is K x N, C is M x N. lda/ldb/ldc
// are row strides in elements, as in cblas_sgemm(CblasRowMajor, ...).
void gemm_row_major(cudaStream_t stream, bool trans_a, bool trans_b, int M, int N, int K,
                    float alpha, const float* A, int lda, long long stride_a,
                    const float* B, int ldb, long long stride_b, float beta,
                    float* C, int ldc, long long stride_c, int batch = 1);

}  // namespace braid::kernels::cuda::detail
