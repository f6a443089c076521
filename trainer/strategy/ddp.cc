#include "trainer/strategy/ddp.h"

#include <cmath>

#include "trainer/strategy/dp_comm.h"

namespace braid::trainer {

DdpStrategy::DdpStrategy(const StrategySetup& setup) : Strategy(setup) {
  ModelStorage storage;
  storage.grads_in = comm_memory_.allocator();
  build_model(std::move(storage));
  comm_memory_.agree({&model_->grads()});
  build_optimizer({Range{0, model_->table().count()}});
  tracker_.emplace(model_->table(), plan_buckets(model_->table(), setup.bucket_bytes));
}

void DdpStrategy::hold_back_unit(int unit) { tracker_->hold_back(unit); }

std::string DdpStrategy::describe() const {
  return "ddp: gradients in " + describe_buckets(tracker_->buckets(), setup_.bucket_bytes) +
         ", all-reduce launched from backward" +
         (buffers_registered() ? ", gradients in registered memory (direct all-reduce on one host)" : "");
}

void DdpStrategy::begin_micro_batch(int index, bool last) {
  Strategy::begin_micro_batch(index, last);
  communicate_ = last;
  tracker_->reset(index == 0);
}

void DdpStrategy::grads_ready(int unit, Range) {
  if (!communicate_) return;
  const int b = tracker_->finish(unit);
  if (b >= 0) all_reduce_bucket(b);
}

void DdpStrategy::reduce_after_backward() {
  for (int b : tracker_->unlaunched()) all_reduce_bucket(b);
}

void DdpStrategy::all_reduce_bucket(int b) {
  tracker_->launched(b);
  const Range bucket = tracker_->buckets()[b];
  float* grads = model_->grads().data() + bucket.offset;
  in_flight_.push_back(meter_.issue_on_device([&](CommMeter::Calls& c, comm::Stream s) {
    return c.all_reduce(grads, grads, bucket.count, DataType::f32, ReduceOp::sum, s);
  }));
}

StepResult DdpStrategy::finish_step(double loss_sum, double tokens, float lr, long step) {
  const bool communicated = !in_flight_.empty();
  meter_.wait_all(in_flight_);
  // Before the loss sum below, the last all-reduce was the last bucket's.
  if (communicated) bucket_algorithm_ = comm_->last_algorithm(comm::OpKind::all_reduce);
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
  return {b, b, "2(N-1)/N x gradient bytes", b};
}

}  // namespace braid::trainer
