// GELU, tanh form, element-wise; the formulas of kernels/cpu/gelu.cc with
// the device's tanhf in place of the CPU's tanh_approx.
#include "kernels/cuda/check.h"
#include "kernels/cuda/gpt_ops.h"

namespace braid::kernels::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__global__ void gelu_forward_kernel(float* out, const float* inp, std::size_t count) {
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float x = inp[i];
    float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    out[i] = 0.5f * x * (1.f + t);
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout,
                                     std::size_t count) {
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float x = inp[i];
    float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    float du_dx = kSqrt2OverPi * (1.f + 3.f * kCubic * x * x);
    float local = 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du_dx;
    dinp[i] += local * dout[i];
  }
}

}  // namespace

void gelu_forward(float* out, const float* inp, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  gelu_forward_kernel<<<detail::grid_for(count), detail::kThreads, 0, stream>>>(out, inp, count);
  detail::check_launch("gelu_forward_kernel");
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t count,
                   cudaStream_t stream) {
  if (count == 0) return;
  gelu_backward_kernel<<<detail::grid_for(count), detail::kThreads, 0, stream>>>(dinp, inp, dout,
                                                                                count);
  detail::check_launch("gelu_backward_kernel");
}

}  // namespace braid::kernels::cuda
