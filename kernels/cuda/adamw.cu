// AdamW, element-wise, in PyTorch's order of operations; kernels/cpu/adamw.cc
// documents the formulas. The per-step scalars are computed on the host in
// double exactly as the CPU version does, so both see the same constants.
#include <cmath>

#include "kernels/cuda/check.h"
#include "kernels/cuda/gpt_ops.h"

namespace braid::kernels::cuda {
namespace {

struct StepScalars {
  float decay, step_size, inv_bc2_sqrt, beta1, beta2, eps;
};

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v,
                             std::size_t count, StepScalars s) {
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float g = grad[i];
    float mi = s.beta1 * m[i] + (1.f - s.beta1) * g;
    float vi = s.beta2 * v[i] + (1.f - s.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) * s.inv_bc2_sqrt + s.eps;
    param[i] = param[i] * s.decay - s.step_size * mi / denom;
  }
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t count,
                  const AdamWParams& p, cudaStream_t stream) {
  if (count == 0) return;
  double t = double(p.step);
  StepScalars s{float(1.0 - double(p.lr) * double(p.weight_decay)),
                float(double(p.lr) / (1.0 - std::pow(double(p.beta1), t))),
                float(1.0 / std::sqrt(1.0 - std::pow(double(p.beta2), t))),
                p.beta1, p.beta2, p.eps};
  adamw_kernel<<<detail::grid_for(count), detail::kThreads, 0, stream>>>(param, grad, m, v, count, s);
  detail::check_launch("adamw_kernel");
}

}  // namespace braid::kernels::cuda
