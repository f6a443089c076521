#include "trainer/strategy/dp.h"

#include <cmath>

namespace braid::trainer {

DpStrategy::DpStrategy(const StrategySetup& setup) : Strategy(setup) {
  build_model(ModelStorage{});
  build_optimizer(is_root() ? std::vector<Range>{Range{0, model_->table().count()}} : std::vector<Range>{});
}

std::string DpStrategy::describe() const {
  return "dp: gradients reduced to rank 0, which steps AdamW and broadcasts the parameters";
}

StepResult DpStrategy::finish_step(double loss_sum, double tokens, float lr, long step) {
  FlatBuffer& grads = model_->grads();
  FlatBuffer& params = model_->params();
  comm::Work reduced = meter_.issue_on_device([&](CommMeter::Calls& c, comm::Stream s) {
    return c.reduce(grads.data(), grads.data(), grads.count(), DataType::f32, ReduceOp::sum, kRoot, s);
  });
  meter_.wait(reduced);
  // [loss sum, norm]: the loss summed to everyone, the norm only the root knows.
  double stats[2] = {loss_sum, 0.0};
  sum_over_ranks({stats, 1});
  if (is_root()) {
    stats[1] = std::sqrt(grad_square_sum(grads.span(), ops()));
    clip_and_update_full(stats[1], lr, step);
  }
  comm::Work published = meter_.issue_on_device([&](CommMeter::Calls& c, comm::Stream s) {
    return c.broadcast(params.data(), params.data(), params.count(), DataType::f32, kRoot, s);
  });
  comm::Work norm = meter_.issue([&](CommMeter::Calls& c) {
    return c.broadcast(&stats[1], &stats[1], 1, DataType::f64, kRoot);
  });
  meter_.wait(published);
  meter_.wait(norm);
  return {stats[0] / tokens, stats[1]};
}

std::vector<Held> DpStrategy::held(Slot slot) {
  return slot == Slot::kParams ? std::vector<Held>{whole_params()} : optimizer_pieces(slot);
}

std::vector<Held> DpStrategy::owned(Slot slot) {
  return slot == Slot::kParams ? even_share(slot) : held(slot);
}

TrafficTheory DpStrategy::traffic_theory(int) const {
  const int N = world_size(), r = rank();
  const double G = 4.0 * model_->table().count();
  if (N == 1) return {0, 0, "0"};
  const double sent = G * ((r != kRoot) + (r != (kRoot + N - 1) % N));
  const double received = G * ((r != (kRoot + 1) % N) + (r != kRoot));
  // Bus bytes: a reduce and a broadcast of G each.
  return {sent, received,
          "a reduce and a broadcast of G = gradient bytes, 2G (through the transports: G per chain not ending here)",
          2 * G};
}

}  // namespace braid::trainer
