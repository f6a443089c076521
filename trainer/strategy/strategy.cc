#include "trainer/strategy/strategy.h"

#include <algorithm>
#include <cmath>

#include "runtime/errors.h"
#include "trainer/model/init.h"

namespace braid::trainer {

namespace {

constexpr std::pair<StrategyKind, std::string_view> kNames[] = {
    {StrategyKind::kNone, "none"},   {StrategyKind::kDp, "dp"},       {StrategyKind::kDdp, "ddp"},
    {StrategyKind::kZero1, "zero1"}, {StrategyKind::kZero2, "zero2"}, {StrategyKind::kZero3, "zero3"},
};

// Copies the elements of [from.offset, from.end()) ∩ [to.offset, to.end())
// from host `src` (which starts at from.offset) to `dst` in `on`'s memory
// (which starts at to.offset).
void copy_overlap(Range from, const float* src, Range to, float* dst, const Backend& on) {
  const Range r = intersect(from, to);
  if (r.count > 0) on.from_host(dst + (r.offset - to.offset), src + (r.offset - from.offset), r.count * sizeof(float));
}

}  // namespace

std::string_view strategy_name(StrategyKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

StrategyKind parse_strategy(std::string_view text) {
  for (const auto& [kind, name] : kNames) {
    if (name == text) return kind;
  }
  throw InvalidUsage("unknown --strategy '" + std::string(text) + "'; choose none, dp, ddp, zero1, zero2 or zero3");
}

MemoryTheory memory_theory(StrategyKind kind, int world_size, int rank, std::size_t param_count) {
  const double P = 4.0 * static_cast<double>(param_count), N = world_size;
  const bool zero = kind == StrategyKind::kZero1 || kind == StrategyKind::kZero2 || kind == StrategyKind::kZero3;
  MemoryTheory t{P, P, 2 * P};
  if (kind == StrategyKind::kDp && rank != 0) t.optimizer = 0;
  if (zero) t.optimizer /= N;
  if (kind == StrategyKind::kZero2 || kind == StrategyKind::kZero3) t.grads /= N;
  if (kind == StrategyKind::kZero3) t.params /= N;
  return t;
}

Strategy::Strategy(const StrategySetup& setup)
    : setup_(setup),
      comm_(setup.comm),
      meter_(setup.comm, &backend(setup.device)),
      comm_memory_(setup.comm, setup.device) {}

Strategy::~Strategy() {
  if (model_) model_->set_hooks(nullptr);
}

void Strategy::build_model(ModelStorage storage) {
  const ModelLayout layout = setup_.layout.value_or(ModelLayout::whole(setup_.model));
  storage.device = setup_.device;
  model_ = std::make_unique<Gpt>(setup_.model, layout, setup_.memory, storage);
  model_->set_hooks(this);
}

void Strategy::build_optimizer(std::vector<Range> owned) {
  optimizer_ = std::make_unique<AdamW>(model_->table(), std::move(owned), setup_.adamw, setup_.memory,
                                       setup_.device);
}

void Strategy::begin_micro_batch(int index, bool last) {
  if (index == 0) model_->zero_grads();
}

void Strategy::reduce_after_backward() {
  if (comm_ != nullptr && comm_->size() > 1) {
    throw InvalidUsage("--strategy " + std::string(strategy_name(kind())) + " cannot reduce after a pipeline's "
                       "backward; use ddp or zero1 with --pp");
  }
}

double Strategy::counted_square_sum(Range range, const float* grads) const {
  if (setup_.model_norm == nullptr) return grad_square_sum({grads, range.count}, ops());
  double sum = 0.0;
  for (const ParamView& v : model_->table().views()) {
    const Range r = intersect(range, v.range());
    if (r.count > 0 && setup_.model_norm->counts(v)) {
      sum += grad_square_sum({grads + (r.offset - range.offset), r.count}, ops());
    }
  }
  return sum;
}

double Strategy::sum_over_model(double square_sum) const {
  return setup_.model_norm != nullptr ? setup_.model_norm->sum_over_model(square_sum) : square_sum;
}

std::vector<Held> Strategy::optimizer_pieces(Slot slot) {
  std::vector<Held> pieces;
  FlatBuffer& state = slot == Slot::kM ? optimizer_->m() : optimizer_->v();
  for (std::size_t i = 0; i < optimizer_->owned().size(); ++i) {
    pieces.push_back({optimizer_->owned()[i], state.data() + optimizer_->state_offset(i)});
  }
  return pieces;
}

std::vector<Held> Strategy::even_share(Slot slot) {
  const Range part = even_part(Range{0, model_->table().count()}, world_size(), rank());
  std::vector<Held> share;
  for (const Held& h : held(slot)) {
    const Range r = intersect(h.range, part);
    if (r.count > 0) share.push_back({r, h.data + (r.offset - h.range.offset)});
  }
  return share;
}

void Strategy::clip_and_update_full(double norm, float lr, long step) {
  clip_grads(model_->grads().span(), norm, setup_.grad_clip, ops());
  optimizer_->update(model_->params().span(), model_->grads().span(), lr, step);
}

void Strategy::write_view(Slot slot, const ParamView& view, const float* values) {
  for (const Held& h : held(slot)) copy_overlap(view.range(), values, h.range, h.data, ops());
}

std::vector<float> Strategy::read_view(Slot slot, const ParamView& view) {
  // Every element is owned by exactly one rank: the others add zeros.
  std::vector<double> sum(view.count(), 0.0);
  std::vector<float> part;
  for (const Held& h : owned(slot)) {
    const Range r = intersect(h.range, view.range());
    part.resize(r.count);
    ops().to_host(part.data(), h.data + (r.offset - h.range.offset), r.count * sizeof(float));
    for (std::size_t i = 0; i < r.count; ++i) sum[r.offset - view.offset + i] = part[i];
  }
  if (world_size() > 1) sum_over_ranks(sum);
  return std::vector<float>(sum.begin(), sum.end());
}

void Strategy::init_params(std::uint64_t seed) {
  std::vector<float> values;
  for (const ParamView& v : model_->table().views()) {
    values.resize(v.count());
    init_view(setup_.model, model_->layout(), v, seed, values.data());
    write_view(Slot::kParams, v, values.data());
  }
}

void Strategy::sum_over_ranks(std::span<double> values) {
  if (comm_ != nullptr) all_reduce_sum(meter_, values);
}

SingleStrategy::SingleStrategy(const StrategySetup& setup) : Strategy(setup) {
  build_model(ModelStorage{});
  build_optimizer({Range{0, model_->table().count()}});
}

StepResult SingleStrategy::finish_step(double loss_sum, double tokens, float lr, long step) {
  const Range all{0, model_->table().count()};
  const double norm = std::sqrt(sum_over_model(counted_square_sum(all, model_->grads().data())));
  clip_and_update_full(norm, lr, step);
  return {loss_sum / tokens, norm};
}

std::vector<Held> SingleStrategy::held(Slot slot) {
  return slot == Slot::kParams ? std::vector<Held>{whole_params()} : optimizer_pieces(slot);
}

}  // namespace braid::trainer
