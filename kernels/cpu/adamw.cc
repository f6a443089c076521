// AdamW (Loshchilov & Hutter), in PyTorch's order of operations:
//   param *= 1 - lr * weight_decay                    (decoupled decay first)
//   m = beta1 m + (1 - beta1) g
//   v = beta2 v + (1 - beta2) g^2
//   param -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// which is param -= lr * mhat / (sqrt(vhat) + eps) with mhat = m / (1 - beta1^t),
// vhat = v / (1 - beta2^t). The per-step scalars are computed in double once,
// as PyTorch does in Python; the element loop is float.
// (GCC keeps the sqrt scalar: without -fno-math-errno it guards it with an
// errno branch. The loop is memory-bound at model sizes anyway.)
#include <cmath>

#include "kernels/cpu/gpt_ops.h"

namespace braid::kernels::cpu {

void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t count,
                  const AdamWParams& p) {
  double t = double(p.step);
  float decay = float(1.0 - double(p.lr) * double(p.weight_decay));
  float step_size = float(double(p.lr) / (1.0 - std::pow(double(p.beta1), t)));
  float inv_bc2_sqrt = float(1.0 / std::sqrt(1.0 - std::pow(double(p.beta2), t)));
  float b1 = p.beta1, b2 = p.beta2, eps = p.eps;
  for (std::size_t i = 0; i < count; ++i) {
    float g = grad[i];
    float mi = b1 * m[i] + (1.f - b1) * g;
    float vi = b2 * v[i] + (1.f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float denom = std::sqrt(vi) * inv_bc2_sqrt + eps;
    param[i] = param[i] * decay - step_size * mi / denom;
  }
}

}  // namespace braid::kernels::cpu
