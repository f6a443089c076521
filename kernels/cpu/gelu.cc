// GELU, tanh approximation (GPT-2's, PyTorch's approximate='tanh'):
//   y  = 0.5 x (1 + tanh(u)),  u = k (x + 0.044715 x^3),  k = sqrt(2/pi)
//   dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) k (1 + 3 * 0.044715 x^2)
// tanh goes through detail::tanh_approx so both loops vectorise.
#include "kernels/cpu/gpt_ops.h"
#include "kernels/cpu/vec_math.h"

namespace braid::kernels::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
}  // namespace

void gelu_forward(float* out, const float* inp, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    float x = inp[i];
    float t = detail::tanh_approx(kSqrt2OverPi * (x + kCubic * x * x * x));
    out[i] = 0.5f * x * (1.f + t);
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    float x = inp[i];
    float t = detail::tanh_approx(kSqrt2OverPi * (x + kCubic * x * x * x));
    float du_dx = kSqrt2OverPi * (1.f + 3.f * kCubic * x * x);
    float local = 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du_dx;
    dinp[i] += local * dout[i];
  }
}

}  // namespace braid::kernels::cpu
