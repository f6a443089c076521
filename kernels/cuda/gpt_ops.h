// Training math for the GPT trainer, CUDA versions: the same functions, with
// the same names, shapes and accumulation rules as kernels/cpu/gpt_ops.h
// (which documents each op and is the spec these are tested against). The
// differences:
//   - every pointer is a device pointer;
//   - every call takes a trailing cudaStream_t (nullptr: the legacy default
//     stream) and is asynchronous on it;
//   - matmul and attention use cuBLAS in full fp32 (no TF32), through one
//     cuBLAS handle per (host thread, device), created on first use;
//   - attention_backward allocates its [NH, T, T] scratch with
//     cudaMallocAsync on the stream and frees it the same way;
//   - results agree with the CPU within float rounding (different summation
//     order, expf/tanhf instead of the CPU's exp_approx, FMA contraction);
//     embedding_backward adds in the CPU's order and matches it bit for bit.
// Errors (bad launch, cuBLAS failure) throw std::runtime_error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cpu/gpt_ops.h"  // AdamWParams

namespace braid::kernels::cuda {

using cpu::AdamWParams;

// out = inp @ weight^T + bias, weight [OC, C]; bias may be null.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int N, int C, int OC, cudaStream_t stream = nullptr);
// dinp += dout @ weight; dweight += dout^T @ inp; dbias += sum_rows(dout).
// dinp or dbias may be null.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC,
                     cudaStream_t stream = nullptr);

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C,
                       cudaStream_t stream = nullptr);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C, cudaStream_t stream = nullptr);

void gelu_forward(float* out, const float* inp, std::size_t count, cudaStream_t stream = nullptr);
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t count,
                   cudaStream_t stream = nullptr);

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS,
                       cudaStream_t stream = nullptr);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        int B, int T, int NH, int HS, cudaStream_t stream = nullptr);

void crossentropy_forward(float* losses, float* probs, const float* logits,
                          const std::int32_t* targets, int N, int V,
                          cudaStream_t stream = nullptr);
void crossentropy_backward(float* dlogits, const float* probs, const std::int32_t* targets,
                           const float* dloss, int N, int V, cudaStream_t stream = nullptr);

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C, cudaStream_t stream = nullptr);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        int B, int T, int C, cudaStream_t stream = nullptr);

// p is read on the host; param, grad, m and v are device pointers.
void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t count,
                  const AdamWParams& p, cudaStream_t stream = nullptr);

// ---- Element-wise helpers and the device (vector_ops.cu) -------------------
// out = a + b (out may alias either).
void add(float* out, const float* a, const float* b, std::size_t count, cudaStream_t stream = nullptr);
void fill(float* p, float value, std::size_t count, cudaStream_t stream = nullptr);
void scale(float* p, float factor, std::size_t count, cudaStream_t stream = nullptr);
// Sum of squares in double. Synchronises the stream and returns the value;
// the same count gives the same order of additions every time.
double square_sum(const float* p, std::size_t count, cudaStream_t stream = nullptr);

struct DeviceDescription {
  int ordinal = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  double clock_ghz = 0.0;           // the boost clock the driver reports
  std::size_t memory_bytes = 0;
  double fp32_peak_gflops = 0.0;    // 2 x FP32 lanes x SMs x clock (no tensor cores)
};
DeviceDescription describe_device(int device);
// Best of a few timed 4096^3 sgemms (fp32, no TF32) through matmul_forward.
double measure_sgemm_gflops(cudaStream_t stream = nullptr);
// Creates the calling thread's cuBLAS handle for the current device now. Its
// creation loads cuBLAS's kernels (cuLibraryLoadData), which waits for every
// kernel of the context: done while a collective holds a stream at its gate,
// it waited for the gate and the collective's kernels waited behind it, so
// two ZeRO-3 ranks sharing an H200 hung at their first matmul (issue 19).
// A backend calls this before its first collective.
void load_blas();
// Opens cuBLAS if it is not open yet (it is opened on first use, not
// linked: blas.cu) and returns the file it came from; needs no GPU. Throws,
// naming where it looked, when there is none.
std::string blas_library();

}  // namespace braid::kernels::cuda
