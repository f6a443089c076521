#include "trainer/strategy/zero.h"

#include <cmath>
#include <span>

#include "runtime/errors.h"

namespace braid::trainer {

ZeroStrategy::ZeroStrategy(const StrategySetup& setup, int stage) : Strategy(setup), stage_(stage) {
  if (stage < 1 || stage > 3) throw InvalidUsage("ZeRO stage " + std::to_string(stage) + " does not exist; use 1, 2 or 3");
  const auto N = static_cast<std::size_t>(world_size());
  ModelStorage storage;
  storage.unit_multiple = N;
  storage.params = stage < 3;
  storage.grads = stage < 2;
  storage.params_in = storage.grads_in = comm_memory_.allocator();  // registered from the start
  build_model(std::move(storage));
  const ParamTable& table = model_->table();
  partition_.emplace(stage == 3 ? unit_buckets(table) : plan_buckets(table, setup.bucket_bytes), world_size(), rank());
  build_optimizer(partition_->chunks());
  if (stage == 1) tracker_.emplace(table, partition_->groups());
  if (stage >= 2) grads_.emplace(*partition_, table, meter_, setup.memory, comm_memory_);
  if (stage == 3) params_.emplace(*partition_, table, meter_, setup.memory, comm_memory_);
  register_buffers();
}

void ZeroStrategy::register_buffers() {
  // Whole parameters (stages 1, 2) and gradients (stage 1) are the model's,
  // the shards the gatherers'; all came from comm_memory_. The same list on
  // every rank.
  FlatBuffer& params = stage_ < 3 ? model_->params() : params_->shard_buffer();
  FlatBuffer& grads = stage_ < 2 ? model_->grads() : grads_->shard_buffer();
  comm_memory_.agree({&params, &grads});
}

StrategyKind ZeroStrategy::kind() const {
  return stage_ == 1 ? StrategyKind::kZero1 : stage_ == 2 ? StrategyKind::kZero2 : StrategyKind::kZero3;
}

std::string ZeroStrategy::describe() const {
  const std::size_t groups = partition_->groups().size();
  return "zero" + std::to_string(stage_) + ": " +
         (stage_ == 3 ? std::to_string(groups) + " units gathered on use"
                      : describe_buckets(partition_->groups(), setup_.bucket_bytes)) +
         ", shard of " + std::to_string(partition_->shard_count()) + " of " +
         std::to_string(model_->table().count()) + " elements (units padded to a multiple of " +
         std::to_string(world_size()) + ")" + (comm_memory_.registers() ? ", buffers in registered memory" : "");
}

void ZeroStrategy::begin_micro_batch(int index, bool last) {
  if (stage_ == 1) {
    Strategy::begin_micro_batch(index, last);
    communicate_ = last;
    tracker_->reset(index == 0);
    return;
  }
  if (index == 0) grads_->zero_shard();
  grads_->begin_micro_batch();
  if (stage_ == 3) params_->begin_training(last);
}

void ZeroStrategy::begin_forward_only() {
  if (stage_ == 3) params_->begin_forward_only();
}

void ZeroStrategy::before_unit(int unit, Pass pass) {
  if (stage_ == 3) params_->before_unit(unit, pass);
}

void ZeroStrategy::after_unit(int unit, Pass pass) {
  if (stage_ == 3) params_->after_unit(unit, pass);
}

float* ZeroStrategy::unit_params(int unit) { return stage_ == 3 ? params_->lend(unit) : nullptr; }

float* ZeroStrategy::unit_grads(int unit) { return stage_ >= 2 ? grads_->lend(unit) : nullptr; }

void ZeroStrategy::grads_ready(int unit, Range) {
  if (stage_ >= 2) {
    grads_->unit_finished(unit);
    return;
  }
  if (!communicate_) return;
  const int g = tracker_->finish(unit);
  if (g >= 0) reduce_scatter_bucket(g);
}

void ZeroStrategy::hold_back_unit(int unit) {
  if (stage_ == 1) tracker_->hold_back(unit);
}

void ZeroStrategy::reduce_scatter_bucket(int group) {
  tracker_->launched(group);
  float* bucket = model_->grads().data() + partition_->groups()[group].offset;
  float* mine = model_->grads().data() + partition_->chunk(group).offset;
  const std::size_t count = partition_->chunk(group).count;
  in_flight_.push_back(meter_.issue_on_device([&](CommMeter::Calls& c, comm::Stream s) {
    return c.reduce_scatter(bucket, mine, count, DataType::f32, ReduceOp::sum, s);
  }));
}

void ZeroStrategy::reduce_after_backward() {
  if (stage_ != 1) return Strategy::reduce_after_backward();
  for (int g : tracker_->unlaunched()) reduce_scatter_bucket(g);
}

void ZeroStrategy::all_gather_params() {
  std::vector<comm::Work> gathers;
  for (std::size_t g = 0; g < partition_->groups().size(); ++g) {
    float* group = model_->params().data() + partition_->groups()[g].offset;
    const float* mine = shard_params(g);
    const std::size_t count = partition_->chunk(g).count;
    gathers.push_back(meter_.issue_on_device(
        [&](CommMeter::Calls& c, comm::Stream s) { return c.all_gather(mine, group, count, DataType::f32, s); }));
  }
  meter_.wait_all(gathers);
}

float* ZeroStrategy::shard_grads(std::size_t g) {
  return stage_ == 1 ? model_->grads().data() + partition_->chunk(g).offset
                     : grads_->shard() + partition_->shard_offset(g);
}

float* ZeroStrategy::shard_params(std::size_t g) {
  return stage_ < 3 ? model_->params().data() + partition_->chunk(g).offset
                    : params_->shard() + partition_->shard_offset(g);
}

double ZeroStrategy::shard_square_sum() {
  double sum = 0.0;
  for (std::size_t g = 0; g < partition_->groups().size(); ++g) {
    sum += counted_square_sum(partition_->chunk(g), shard_grads(g));
  }
  return sum;
}

StepResult ZeroStrategy::finish_step(double loss_sum, double tokens, float lr, long step) {
  if (stage_ == 1) meter_.wait_all(in_flight_);
  if (stage_ >= 2) grads_->drain();
  // No gather may still read the shards the optimizer is about to change.
  if (stage_ == 3) params_->release_all();
  double stats[2] = {loss_sum, shard_square_sum()};
  sum_over_ranks(stats);
  const double norm = std::sqrt(sum_over_model(stats[1]));
  for (std::size_t g = 0; g < partition_->groups().size(); ++g) {
    clip_grads({shard_grads(g), partition_->chunk(g).count}, norm, setup_.grad_clip, ops());
    optimizer_->update_piece(g, shard_params(g), shard_grads(g), lr, step);
  }
  if (stage_ < 3) all_gather_params();
  return {stats[0] / tokens, norm};
}

std::vector<Held> ZeroStrategy::owned(Slot slot) {
  if (slot != Slot::kParams) return optimizer_pieces(slot);
  std::vector<Held> chunks;
  for (std::size_t g = 0; g < partition_->groups().size(); ++g) chunks.push_back({partition_->chunk(g), shard_params(g)});
  return chunks;
}

std::vector<Held> ZeroStrategy::held(Slot slot) {
  return slot == Slot::kParams && stage_ < 3 ? std::vector<Held>{whole_params()} : owned(slot);
}

TrafficTheory ZeroStrategy::traffic_theory(int grad_accum) const {
  const ParamTable& table = model_->table();
  const double N = world_size(), A = grad_accum, bytes = 4.0 * table.count();
  const double f = (N - 1) / N;
  if (stage_ == 1) return {2 * f * bytes, 2 * f * bytes, "2(N-1)/N x padded parameter bytes", 2 * f * bytes};
  if (stage_ == 2) {
    const double b = (A + 1) * f * bytes;
    return {b, b, "(A+1)(N-1)/N x padded parameter bytes", b};
  }
  // Per micro-batch two gathers of every unit (forward, backward) and one
  // reduce-scatter, but the head stays gathered from its forward into its
  // backward (one gather fewer, H), and the embedding is gathered once more
  // per step for the head's tied wte (it then stays gathered from one
  // micro-batch's backward into the next one's forward: E once, not A times).
  auto unit_bytes = [&](int unit) { return unit >= 0 ? 4.0 * table.units()[unit].range.count : 0.0; };
  const double E = unit_bytes(table.embedding_unit()), H = unit_bytes(table.head_unit());
  const double b = f * (3 * A * bytes + E - A * H);
  return {b, b, "(N-1)/N x (3A x padded parameter bytes + embedding - A x head)", b};
}

}  // namespace braid::trainer
