#include "trainer/strategy/ddp.h"

#include <cmath>

#include "trainer/strategy/dp_comm.h"

namespace braid::trainer {

DdpStrategy::DdpStrategy(const StrategySetup& setup) : Strategy(setup) {
  build_model(ModelStorage{});
  build_optimizer({Range{0, model_->table().count()}});
  tracker_.emplace(model_->table(), plan_buckets(model_->table(), setup.bucket_bytes));
  held_back_.assign(tracker_->buckets().size(), false);
  launched_.assign(tracker_->buckets().size(), false);
}

void DdpStrategy::hold_back_unit(int unit) {
  held_back_.at(static_cast<std::size_t>(tracker_->bucket_of(unit))) = true;
}

std::string DdpStrategy::describe() const {
  return "ddp: " + std::to_string(tracker_->buckets().size()) + " gradient bucket(s) of >= " +
         std::to_string(setup_.bucket_bytes) + " bytes, ring all-reduce launched from backward";
}

void DdpStrategy::begin_micro_batch(int index, bool last) {
  Strategy::begin_micro_batch(index, last);
  communicate_ = last;
  tracker_->reset();
  if (index == 0) launched_.assign(launched_.size(), false);
}

void DdpStrategy::grads_ready(int unit, Range) {
  if (!communicate_) return;
  const int b = tracker_->finish(unit);
  if (b < 0 || held_back_[static_cast<std::size_t>(b)]) return;
  all_reduce_bucket(b);
}

void DdpStrategy::reduce_after_backward() {
  for (std::size_t b = 0; b < tracker_->buckets().size(); ++b)
    if (!launched_[b]) all_reduce_bucket(static_cast<int>(b));
}

void DdpStrategy::all_reduce_bucket(int b) {
  launched_[static_cast<std::size_t>(b)] = true;
  const Range bucket = tracker_->buckets()[b];
  float* grads = model_->grads().data() + bucket.offset;
  in_flight_.push_back(meter_.issue([&](comm::Communicator& c) {
    return c.all_reduce(grads, grads, bucket.count, DataType::f32, ReduceOp::sum);
  }));
}

StepResult DdpStrategy::finish_step(double loss_sum, double tokens, float lr, long step) {
  meter_.wait_all(in_flight_);
  sum_over_ranks({&loss_sum, 1});
  // Every rank holds the same summed gradients, so the same norm.
  const Range all{0, model_->table().count()};
  const double norm = std::sqrt(sum_over_model(counted_square_sum(all, model_->grads().data())));
  clip_and_update_full(norm, lr, step);
  return {loss_sum / tokens, norm};
}

std::vector<Held> DdpStrategy::held(Slot slot) {
  return slot == Slot::kParams ? std::vector<Held>{whole_params()} : optimizer_pieces(slot);
}

TrafficTheory DdpStrategy::traffic_theory(int) const {
  const double N = world_size(), bytes = 4.0 * model_->table().count();
  const double b = 2.0 * (N - 1) / N * bytes;
  return {b, b, "2(N-1)/N x gradient bytes"};
}

}  // namespace braid::trainer
