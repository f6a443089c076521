// Token plus position embedding; kernels/cpu/embedding.cc is the spec.
//
// The backward adds in the CPU's order, so it matches it bit for bit and is
// deterministic without atomics:
//   dwpe: one thread per (t, c) adds dout[b, t, c] for b = 0, 1, ...;
//   dwte: the vocabulary is split into kVocabSlices by token % kVocabSlices.
//         Thread (slice, c) walks all B*T tokens in (b, t) order and adds the
//         rows whose token falls in its slice, so every element of dwte is
//         updated by one thread, in the CPU's order. The token array is read
//         by every thread (broadcast from cache); the updates are coalesced
//         across c.
#include "kernels/cuda/check.h"
#include "kernels/cuda/gpt_ops.h"

namespace braid::kernels::cuda {
namespace {

constexpr int kVocabSlices = 64;

__global__ void embedding_forward_kernel(float* out, const std::int32_t* tokens, const float* wte,
                                         const float* wpe, int BT, int T, int C) {
  std::size_t count = std::size_t(BT) * C;
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    std::size_t bt = i / C, c = i % C, t = bt % T;
    out[i] = wte[std::size_t(tokens[bt]) * C + c] + wpe[t * C + c];
  }
}

__global__ void position_backward_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  std::size_t count = std::size_t(T) * C;
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += dout[std::size_t(b) * count + i];
    dwpe[i] = acc;
  }
}

__global__ void token_backward_kernel(float* dwte, const float* dout, const std::int32_t* tokens,
                                      int BT, int C) {
  int c = blockIdx.x * blockDim.x + threadIdx.x, slice = blockIdx.y;
  if (c >= C) return;
  for (int bt = 0; bt < BT; ++bt) {
    std::int32_t token = tokens[bt];
    if (token % kVocabSlices == slice) dwte[std::size_t(token) * C + c] += dout[std::size_t(bt) * C + c];
  }
}

}  // namespace

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C, cudaStream_t stream) {
  std::size_t count = std::size_t(B) * T * C;
  if (count == 0) return;
  embedding_forward_kernel<<<detail::grid_for(count), detail::kThreads, 0, stream>>>(
      out, tokens, wte, wpe, B * T, T, C);
  detail::check_launch("embedding_forward_kernel");
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        int B, int T, int C, cudaStream_t stream) {
  if (std::size_t(B) * T * C == 0) return;
  position_backward_kernel<<<detail::grid_for(std::size_t(T) * C), detail::kThreads, 0, stream>>>(
      dwpe, dout, B, T, C);
  detail::check_launch("position_backward_kernel");
  dim3 grid((C + detail::kThreads - 1) / detail::kThreads, kVocabSlices);
  token_backward_kernel<<<grid, detail::kThreads, 0, stream>>>(dwte, dout, tokens, B * T, C);
  detail::check_launch("token_backward_kernel");
}

}  // namespace braid::kernels::cuda
