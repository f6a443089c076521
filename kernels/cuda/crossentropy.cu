// Softmax cross-entropy, natural log; the math of kernels/cpu/crossentropy.cc.
// Forward: one block per row: block max, then exp and sum in one pass, then
// scale by 1/sum; the loss is log(sum) - (logit[target] - max), finite even
// when probs[target] underflows. Backward: element-wise over N x V, adding
// probs * dloss and then subtracting dloss at the target, in the CPU's order.
#include "kernels/cuda/check.h"
#include "kernels/cuda/gpt_ops.h"
#include "kernels/cuda/warp.h"

namespace braid::kernels::cuda {
namespace {

constexpr int kRowThreads = 512;

__global__ void crossentropy_forward_kernel(float* losses, float* probs, const float* logits,
                                            const std::int32_t* targets, int V) {
  int n = blockIdx.x;
  const float* x = logits + std::size_t(n) * V;
  float* p = probs + std::size_t(n) * V;
  float max = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) max = fmaxf(max, x[v]);
  max = detail::block_max(max);
  float sum = 0.f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float e = expf(x[v] - max);
    p[v] = e;
    sum += e;
  }
  sum = detail::block_sum(sum);
  float inv = 1.f / sum;
  for (int v = threadIdx.x; v < V; v += blockDim.x) p[v] *= inv;
  if (threadIdx.x == 0) losses[n] = logf(sum) - (x[targets[n]] - max);
}

__global__ void crossentropy_backward_kernel(float* dlogits, const float* probs,
                                             const std::int32_t* targets, const float* dloss,
                                             int N, int V) {
  std::size_t count = std::size_t(N) * V;
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    int n = int(i / V), v = int(i % V);
    float d = dloss[n];
    float dx = dlogits[i] + probs[i] * d;
    if (v == targets[n]) dx -= d;
    dlogits[i] = dx;
  }
}

}  // namespace

void crossentropy_forward(float* losses, float* probs, const float* logits,
                          const std::int32_t* targets, int N, int V, cudaStream_t stream) {
  if (N == 0) return;
  crossentropy_forward_kernel<<<N, kRowThreads, 0, stream>>>(losses, probs, logits, targets, V);
  detail::check_launch("crossentropy_forward_kernel");
}

void crossentropy_backward(float* dlogits, const float* probs, const std::int32_t* targets,
                           const float* dloss, int N, int V, cudaStream_t stream) {
  std::size_t count = std::size_t(N) * V;
  if (count == 0) return;
  crossentropy_backward_kernel<<<detail::grid_for(count), detail::kThreads, 0, stream>>>(
      dlogits, probs, targets, dloss, N, V);
  detail::check_launch("crossentropy_backward_kernel");
}

}  // namespace braid::kernels::cuda
