// cuBLAS is column-major. A row-major matrix X with row stride ld is, read
// column-major with the same ld, X^T. So row-major C = op(A) op(B) is
// column-major C^T = op(B)^T op(A)^T: call cuBLAS with the operands swapped,
// the same transpose flags, and M and N swapped. No data moves.
#include <map>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/check.h"

namespace braid::kernels::cuda::detail {

cublasHandle_t cublas_handle(cudaStream_t stream) {
  thread_local std::map<int, cublasHandle_t> handles;  // device -> handle
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  auto [it, inserted] = handles.try_emplace(device, nullptr);
  if (inserted) {
    check(cublasCreate(&it->second), "cublasCreate");
    check(cublasSetMathMode(it->second, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  check(cublasSetStream(it->second, stream), "cublasSetStream");
  return it->second;
}

void gemm_row_major(cudaStream_t stream, bool trans_a, bool trans_b, int M, int N, int K,
                    float alpha, const float* A, int lda, long long stride_a,
                    const float* B, int ldb, long long stride_b, float beta,
                    float* C, int ldc, long long stride_c, int batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasSgemmStridedBatched(cublas_handle(stream), op_b, op_a, N, M, K, &alpha,
                                  B, ldb, stride_b, A, lda, stride_a, &beta,
                                  C, ldc, stride_c, batch),
        "cublasSgemmStridedBatched");
}

}  // namespace braid::kernels::cuda::detail

namespace braid::kernels::cuda {

void load_blas() { detail::cublas_handle(nullptr); }

}  // namespace braid::kernels::cuda
