// Training math for the GPT trainer, CPU versions (the spec the CUDA kernels
// are tested against). Pure compute: no communication, no allocation of
// parameters. Forward and backward of an op live together in one file,
// kernels/cpu/<op>.cc.
//
// Dimensions, as llm.c names them:
//   B batch, T sequence length, C channels (n_embd, or this TP rank's slice),
//   OC output channels, NH heads (this TP rank's heads), HS head size,
//   V vocabulary, N rows (B*T).
// Every backward ACCUMULATES (+=) into its gradient outputs, so gradients of
// a parameter used twice (the tied embedding) and residual branches add up.
#pragma once

#include <cstddef>
#include <cstdint>

namespace braid::kernels::cpu {

// Sets the BLAS library to `threads` threads (1 per rank unless told otherwise).
void set_blas_threads(int threads);
// Has the BLAS library map its work buffers now (OpenBLAS: 128 MiB per
// thread, at its first large product). Under an address-space limit
// (ulimit -v) that the run's own memory then used up, OpenBLAS retried that
// mmap forever, at 100% CPU; mapped first, it is there, and running out
// fails on an allocation of the run's own.
void map_blas_buffers();

// out = inp @ weight^T + bias.  weight is stored [OC, C] (PyTorch Linear).
// bias may be null.
void matmul_forward(float* out,                 // [N, OC]
                    const float* inp,           // [N, C]
                    const float* weight,        // [OC, C]
                    const float* bias,          // [OC] or null
                    int N, int C, int OC);
// dinp += dout @ weight; dweight += dout^T @ inp; dbias += sum_rows(dout).
// dinp or dbias may be null (not needed).
void matmul_backward(float* dinp,               // [N, C] or null
                     float* dweight,            // [OC, C]
                     float* dbias,              // [OC] or null
                     const float* dout,         // [N, OC]
                     const float* inp,          // [N, C]
                     const float* weight,       // [OC, C]
                     int N, int C, int OC);

// LayerNorm with eps 1e-5; mean and rstd saved for backward.
void layernorm_forward(float* out,              // [N, C]
                       float* mean,             // [N]
                       float* rstd,             // [N]
                       const float* inp,        // [N, C]
                       const float* weight,     // [C]
                       const float* bias,       // [C]
                       int N, int C);
void layernorm_backward(float* dinp,            // [N, C]
                        float* dweight,         // [C]
                        float* dbias,           // [C]
                        const float* dout,      // [N, C]
                        const float* inp,       // [N, C]
                        const float* weight,    // [C]
                        const float* mean,      // [N]
                        const float* rstd,      // [N]
                        int N, int C);

// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, std::size_t count);
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t count);

// Causal multi-head self-attention over a fused qkv activation. For each
// token the row of qkv holds [q (NH*HS) | k (NH*HS) | v (NH*HS)]; head h uses
// columns h*HS .. h*HS+HS of each. Scores scaled by 1/sqrt(HS). `att` keeps
// the softmax probabilities for backward; `out` is [B, T, NH*HS] with head h
// in columns h*HS .. h*HS+HS.
void attention_forward(float* out,              // [B, T, NH*HS]
                       float* att,              // [B, NH, T, T]
                       const float* qkv,        // [B, T, 3*NH*HS]
                       int B, int T, int NH, int HS);
void attention_backward(float* dqkv,            // [B, T, 3*NH*HS]
                        const float* dout,      // [B, T, NH*HS]
                        const float* qkv,       // [B, T, 3*NH*HS]
                        const float* att,       // [B, NH, T, T]
                        int B, int T, int NH, int HS);

// Softmax cross-entropy (natural log). probs keeps the softmax for backward.
// losses[i] = -log(probs[i, targets[i]]).
void crossentropy_forward(float* losses,        // [N]
                          float* probs,         // [N, V]
                          const float* logits,  // [N, V]
                          const std::int32_t* targets,  // [N]
                          int N, int V);
// dlogits += (probs - onehot(targets)) * dloss[i]
void crossentropy_backward(float* dlogits,      // [N, V]
                           const float* probs,  // [N, V]
                           const std::int32_t* targets,  // [N]
                           const float* dloss,  // [N]
                           int N, int V);

// out[b, t] = wte[tokens[b, t]] + wpe[t].
void embedding_forward(float* out,              // [B, T, C]
                       const std::int32_t* tokens,  // [B, T]
                       const float* wte,        // [V, C]
                       const float* wpe,        // [maxT, C]
                       int B, int T, int C);
// dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += dout[b,t].
void embedding_backward(float* dwte, float* dwpe,
                        const float* dout,      // [B, T, C]
                        const std::int32_t* tokens,  // [B, T]
                        int B, int T, int C);

// One AdamW step over a contiguous range (decoupled weight decay: pass
// weight_decay 0 for parameters that are not decayed). `step` counts from 1
// for bias correction.
struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  long step;
};
void adamw_update(float* param, const float* grad, float* m, float* v,
                  std::size_t count, const AdamWParams& p);

}  // namespace braid::kernels::cpu

// ---- Additions (after the fixed API above) ---------------------------------
namespace braid::kernels::cpu {

// Single-thread sgemm peak in GFLOP/s: best of a few timed 1024x1024x1024
// sgemms (2 * 1024^3 flops each) with OpenBLAS set to one thread, then the
// previous thread count restored. Takes about 0.2 s. The trainer divides its
// achieved GFLOP/s by this to report MFU.
double measure_sgemm_gflops();

}  // namespace braid::kernels::cpu
