#include "trainer/model/activations.h"

#include "runtime/errors.h"

namespace braid::trainer {

namespace {

// Hands out consecutive pieces of one buffer.
struct Carver {
  float* next;
  float* take(std::size_t count) {
    float* p = next;
    next += count;
    return p;
  }
};

}  // namespace

// Per block: ln_1, residual_2, ln_2, output [N, C]; two means and two
// rstds [N]; qkv 3, atty 1, fch 4, fch_gelu 4 [N, Cl]; att [B, NHl, T, T].
// The head: ln_f [N, C], its mean and rstd, losses and dlosses [N], logits
// and probs [N, V]. Then input, proj, dresidual [N, C] and the int32 tokens
// and targets [N].
double Activations::float_count(const GptConfig& c, const ModelLayout& l, double B, double T) {
  const double N = B * T, C = c.n_embd, Cl = l.local_embd(c), NHl = l.local_heads(c), V = c.vocab_size;
  const double block = 4 * N * C + 4 * N + 12 * N * Cl + B * NHl * T * T;
  const double head = l.pp_is_last_stage ? N * C + 4 * N + 2 * N * V : 0;
  return block * (l.pp_last_layer - l.pp_first_layer) + head + 3 * N * C + 2 * N;
}

Activations::Activations(const GptConfig& c, const ModelLayout& l, int B, int T, MemoryAccount* account,
                         Device device)
    : cap_B_(B), cap_T_(T), B_(B), T_(T), first_layer_(l.pp_first_layer) {
  if (B < 1 || T < 1 || T > c.block_size) {
    throw InvalidUsage("activations need 1 <= B and 1 <= T <= block_size (got B " + std::to_string(B) +
                       ", T " + std::to_string(T) + ")");
  }
  N_ = static_cast<std::size_t>(B) * T;
  C_ = c.n_embd;
  Cl_ = l.local_embd(c);
  NHl_ = l.local_heads(c);
  V_ = c.vocab_size;
  has_head_ = l.pp_is_last_stage;
  const std::size_t att = static_cast<std::size_t>(B) * NHl_ * T * T;
  block_stride_ = 4 * N_ * C_ + 4 * N_ + 12 * N_ * Cl_ + att;
  const std::size_t head = has_head_ ? N_ * C_ + 4 * N_ + 2 * N_ * V_ : 0;
  const std::size_t blocks = block_stride_ * (l.pp_last_layer - l.pp_first_layer);
  // The int32 tokens and targets live in the same (device) memory.
  static_assert(sizeof(std::int32_t) == sizeof(float));
  const auto count = static_cast<std::size_t>(float_count(c, l, B, T));
  buffer_ = FlatBuffer(count, MemoryCategory::kActivations, account, device);
  Carver carve{buffer_.data()};
  blocks_ = carve.take(blocks);
  head_ = carve.take(head);
  input_ = carve.take(N_ * C_);
  proj_ = carve.take(N_ * C_);
  dresidual_ = carve.take(N_ * C_);
  tokens_ = reinterpret_cast<std::int32_t*>(carve.take(N_));
  targets_ = reinterpret_cast<std::int32_t*>(carve.take(N_));
}

void Activations::set_shape(int B, int T) {
  if (B < 1 || T < 1 || B > cap_B_ || T > cap_T_) {
    throw InvalidUsage("a pass of B " + std::to_string(B) + ", T " + std::to_string(T) +
                       " does not fit activations sized for B " + std::to_string(cap_B_) + ", T " +
                       std::to_string(cap_T_));
  }
  B_ = B;
  T_ = T;
}

BlockActivations Activations::block(int layer) {
  Carver carve{blocks_ + block_stride_ * static_cast<std::size_t>(layer - first_layer_)};
  BlockActivations a;
  a.ln_1 = carve.take(N_ * C_);
  a.ln_1_mean = carve.take(N_);
  a.ln_1_rstd = carve.take(N_);
  a.qkv = carve.take(3 * N_ * Cl_);
  a.atty = carve.take(N_ * Cl_);
  a.att = carve.take(static_cast<std::size_t>(cap_B_) * NHl_ * cap_T_ * cap_T_);
  a.residual_2 = carve.take(N_ * C_);
  a.ln_2 = carve.take(N_ * C_);
  a.ln_2_mean = carve.take(N_);
  a.ln_2_rstd = carve.take(N_);
  a.fch = carve.take(4 * N_ * Cl_);
  a.fch_gelu = carve.take(4 * N_ * Cl_);
  a.output = carve.take(N_ * C_);
  return a;
}

HeadActivations Activations::head() {
  if (!has_head_) throw InvalidUsage("this pipeline stage holds no head activations");
  Carver carve{head_};
  HeadActivations h;
  h.ln_f = carve.take(N_ * C_);
  h.ln_f_mean = carve.take(N_);
  h.ln_f_rstd = carve.take(N_);
  h.logits = carve.take(N_ * V_);
  h.probs = carve.take(N_ * V_);
  h.losses = carve.take(N_);
  h.dlosses = carve.take(N_);
  return h;
}

}  // namespace braid::trainer
