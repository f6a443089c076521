#include "trainer/strategy/traffic_theory.h"

#include <string>

namespace braid::trainer {

namespace {

// Bytes of one micro-batch's activation [B, T, C].
double activation_bytes(const GptConfig& c, const StepShape& s) {
  return 4.0 * s.B * s.T * static_cast<double>(c.n_embd);
}

}  // namespace

TrafficTheory tp_traffic_theory(const GptConfig& c, const ModelLayout& layout, const StepShape& s) {
  const double t = layout.tp_size;
  if (layout.tp_size <= 1) return {0, 0, "0", 0};
  const double blocks = layout.pp_last_layer - layout.pp_first_layer;
  const double bus = 4.0 * blocks * s.micro_batches * 2.0 * (t - 1) / t * activation_bytes(c, s);
  const std::string formula = "4 all-reduces (Megatron's f, g) x " + std::to_string(static_cast<int>(blocks)) +
                              " block(s) x M x 2(t-1)/t x 4BTC";
  return {bus, bus, formula, bus};
}

TrafficTheory pp_traffic_theory(const GptConfig& c, const ModelLayout& layout, int stages, const StepShape& s) {
  if (stages <= 1) return {0, 0, "0", 0};
  const double neighbours = (layout.pp_is_last_stage ? 0 : 1) + (layout.pp_is_first_stage ? 0 : 1);
  const double p2p = neighbours * s.micro_batches * activation_bytes(c, s);
  const bool holds_wte = layout.pp_is_first_stage || layout.pp_is_last_stage;
  // The two-rank all-reduce of wte's gradient: 2(2-1)/2 x 4VC.
  const double tied = holds_wte ? 4.0 * c.vocab_size * static_cast<double>(c.n_embd) : 0.0;
  const double bus = p2p + tied;
  return {bus, bus, "M x 4BTC to each neighbour stage + 4VC (tied wte, first and last stage)", bus};
}

}  // namespace braid::trainer
