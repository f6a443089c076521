// DP in its parameter-server form: every rank computes the gradients of its
// share of the batch; after backward they are summed onto rank 0 (the
// server) by comm.reduce; rank 0 alone clips them, steps AdamW (so only it
// holds optimizer state) and broadcasts the new parameters. No overlap with
// backward: this is the baseline DDP improves on.
//
// Traffic, derived for braid's algorithms (messages above 32 KiB): reduce
// runs a pipelined chain 1 -> 2 -> ... -> N-1 -> 0 and broadcast a chain
// 0 -> 1 -> ... -> N-1, each moving the whole gradient (parameter) bytes G
// over every link of its chain. So rank r sends G for each chain in which
// it is not the end (reduce: r != 0; broadcast: r != N-1) and receives G for
// each in which it is not the start (reduce: r != 1; broadcast: r != 0).
// Over the ranks that averages 2(N-1)/N x G each way, as for all-reduce; a
// star-shaped server would instead carry (N-1) x G on rank 0's link.
#pragma once

#include "trainer/strategy/strategy.h"

namespace braid::trainer {

class DpStrategy : public Strategy {
 public:
  explicit DpStrategy(const StrategySetup& setup);
  StrategyKind kind() const override { return StrategyKind::kDp; }
  std::string describe() const override;

  StepResult finish_step(double loss_sum, double tokens, float lr, long step) override;

  std::vector<Held> held(Slot slot) override;
  std::vector<Held> owned(Slot slot) override;
  TrafficTheory traffic_theory(int grad_accum) const override;

 private:
  static constexpr int kRoot = 0;
  bool is_root() const { return rank() == kRoot; }
};

}  // namespace braid::trainer
