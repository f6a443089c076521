// Token plus position embedding. The backward scatters rows of dout into
// dwte in token order (b, t ascending), so repeated tokens add up in a fixed
// order: deterministic without atomics.
#include "kernels/cpu/gpt_ops.h"

namespace braid::kernels::cpu {

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      std::size_t bt = std::size_t(b) * T + t;
      const float* tok = wte + std::size_t(tokens[bt]) * C;
      const float* pos = wpe + std::size_t(t) * C;
      float* y = out + bt * C;
      for (int i = 0; i < C; ++i) y[i] = tok[i] + pos[i];
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout,
                        const std::int32_t* tokens, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      std::size_t bt = std::size_t(b) * T + t;
      const float* dy = dout + bt * C;
      float* dtok = dwte + std::size_t(tokens[bt]) * C;
      float* dpos = dwpe + std::size_t(t) * C;
      for (int i = 0; i < C; ++i) {
        dtok[i] += dy[i];
        dpos[i] += dy[i];
      }
    }
  }
}

}  // namespace braid::kernels::cpu
