// Softmax cross-entropy over V classes per row, natural log.
//
// Forward per row: shift by the row max (no overflow), exponentiate and sum
// in one pass, scale by 1/sum. The loss is computed as log-sum-exp minus the
// target logit, log(sum) - (logit[t] - max), which equals -log(probs[t]) but
// stays finite and accurate when probs[t] underflows.
// Backward: dlogits += (probs - onehot(target)) * dloss, row by row.
#include <cmath>

#include "kernels/cpu/gpt_ops.h"
#include "kernels/cpu/vec_math.h"

namespace braid::kernels::cpu {

void crossentropy_forward(float* losses, float* probs, const float* logits,
                          const std::int32_t* targets, int N, int V) {
  for (int n = 0; n < N; ++n) {
    const float* x = logits + std::size_t(n) * V;
    float* p = probs + std::size_t(n) * V;
    float max = detail::max_lanes(x, V);
    float sum = detail::exp_store_sum(p, x, max, V);
    float inv = 1.f / sum;
    for (int v = 0; v < V; ++v) p[v] *= inv;
    losses[n] = std::log(sum) - (x[targets[n]] - max);
  }
}

void crossentropy_backward(float* dlogits, const float* probs, const std::int32_t* targets,
                           const float* dloss, int N, int V) {
  for (int n = 0; n < N; ++n) {
    const float* p = probs + std::size_t(n) * V;
    float* dx = dlogits + std::size_t(n) * V;
    float d = dloss[n];
    for (int v = 0; v < V; ++v) dx[v] += p[v] * d;
    dx[targets[n]] -= d;
  }
}

}  // namespace braid::kernels::cpu
