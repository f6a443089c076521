// LayerNorm over the last dimension, eps 1e-5, biased variance (PyTorch's).
//
// Forward per row: mean, then variance from a second pass over (x - mean)
// (no E[x^2] - mean^2 cancellation), then out = (x - mean) * rstd * w + b.
// Backward per row, with xhat = (x - mean) * rstd and g = dout * w:
//   dinp = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dweight += dout * xhat,  dbias += dout
// Row sums go through detail::sum_lanes / dot_lanes (fixed order, vectorised);
// dweight and dbias accumulate row after row, so their order is fixed too.
#include <cmath>
#include <vector>

#include "kernels/cpu/gpt_ops.h"
#include "kernels/cpu/vec_math.h"

namespace braid::kernels::cpu {

namespace {
constexpr float kEps = 1e-5f;
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  std::vector<float> centred(C);
  for (int n = 0; n < N; ++n) {
    const float* x = inp + std::size_t(n) * C;
    float* y = out + std::size_t(n) * C;
    float m = detail::sum_lanes(x, C) / float(C);
    for (int i = 0; i < C; ++i) centred[i] = x[i] - m;
    float var = detail::dot_lanes(centred.data(), centred.data(), C) / float(C);
    float s = 1.f / std::sqrt(var + kEps);
    for (int i = 0; i < C; ++i) y[i] = centred[i] * s * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C) {
  std::vector<float> xhat(C), g(C);
  for (int n = 0; n < N; ++n) {
    const float* x = inp + std::size_t(n) * C;
    const float* dy = dout + std::size_t(n) * C;
    float* dx = dinp + std::size_t(n) * C;
    float m = mean[n], s = rstd[n];
    for (int i = 0; i < C; ++i) {
      xhat[i] = (x[i] - m) * s;
      g[i] = dy[i] * weight[i];
    }
    float g_mean = detail::sum_lanes(g.data(), C) / float(C);
    float gx_mean = detail::dot_lanes(g.data(), xhat.data(), C) / float(C);
    for (int i = 0; i < C; ++i) {
      dx[i] += s * (g[i] - g_mean - xhat[i] * gx_mean);
      dweight[i] += dy[i] * xhat[i];
      dbias[i] += dy[i];
    }
  }
}

}  // namespace braid::kernels::cpu
