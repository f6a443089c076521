#include "trainer/optim/adamw.h"

#include <cmath>
#include <numbers>

#include "kernels/cpu/gpt_ops.h"  // AdamWParams

namespace braid::trainer {

namespace {

std::vector<std::size_t> prefix_sums(const std::vector<Range>& pieces) {
  std::vector<std::size_t> offsets;
  std::size_t sum = 0;
  for (const Range& r : pieces) {
    offsets.push_back(sum);
    sum += r.count;
  }
  offsets.push_back(sum);
  return offsets;
}

}  // namespace

AdamW::AdamW(const ParamTable& table, std::vector<Range> owned, const AdamWConfig& config, MemoryAccount* account,
             Device device)
    : table_(table),
      owned_(std::move(owned)),
      state_offsets_(prefix_sums(owned_)),
      config_(config),
      m_(state_offsets_.back(), MemoryCategory::kOptimizerState, account, device),
      v_(state_offsets_.back(), MemoryCategory::kOptimizerState, account, device) {}

void AdamW::update(std::span<float> params, std::span<const float> grads, float lr, long step) {
  for (std::size_t i = 0; i < owned_.size(); ++i) {
    update_piece(i, params.data() + owned_[i].offset, grads.data() + owned_[i].offset, lr, step);
  }
}

void AdamW::update_piece(std::size_t piece, float* params, const float* grads, float lr, long step) {
  const Range owned = owned_[piece];
  for (const ParamView& view : table_.views()) {
    const Range r = intersect(view.range(), owned);
    if (r.count == 0) continue;
    kernels::cpu::AdamWParams p{lr, config_.beta1, config_.beta2, config_.eps,
                                view.decay ? config_.weight_decay : 0.0f, step};
    const std::size_t at = r.offset - owned.offset, state = state_offsets_[piece] + at;
    m_.backend().adamw_update(params + at, grads + at, m_.data() + state, v_.data() + state, r.count, p);
  }
}

float LrSchedule::at(long step) const {
  if (step < warmup_steps) return lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  const double span = static_cast<double>(std::max(1L, steps - warmup_steps));
  const double ratio = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return static_cast<float>(min_lr + coeff * (lr - min_lr));
}

double grad_square_sum(std::span<const float> grads, const Backend& on) {
  return on.square_sum(grads.data(), grads.size());
}

float clip_grads(std::span<float> grads, double norm, float max_norm, const Backend& on) {
  if (max_norm <= 0.0f || !(norm > max_norm)) return 1.0f;
  const float scale = static_cast<float>(max_norm / (norm + 1e-6));
  on.scale(grads.data(), scale, grads.size());
  return scale;
}

}  // namespace braid::trainer
