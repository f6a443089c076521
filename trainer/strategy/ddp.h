// DDP (Li et al., "PyTorch Distributed", VLDB 2020): every rank holds the
// whole model and optimizer; gradients are summed by ring all-reduce bucket
// by bucket, each bucket launched asynchronously from grads_ready as soon as
// backward has finished all its units, so the all-reduce of the later layers
// overlaps the backward of the earlier ones. With gradient accumulation the
// micro-batches accumulate locally and only the last one communicates.
// Every rank then clips and steps the same summed gradients: the replicas
// stay identical without sending a parameter. On one host over shm the
// gradient buffer is registered memory (comm_memory.h), so buckets of at
// least 64 KiB run the direct all-reduce instead of the ring.
#pragma once

#include <optional>
#include <vector>

#include "trainer/strategy/strategy.h"

namespace braid::trainer {

class DdpStrategy : public Strategy {
 public:
  explicit DdpStrategy(const StrategySetup& setup);
  StrategyKind kind() const override { return StrategyKind::kDdp; }
  std::string describe() const override;

  void begin_micro_batch(int index, bool last) override;
  void grads_ready(int unit, Range grads) override;
  void reduce_after_backward() override;
  bool overlaps_pipeline() const override { return true; }
  void hold_back_unit(int unit) override;
  StepResult finish_step(double loss_sum, double tokens, float lr, long step) override;

  std::vector<Held> held(Slot slot) override;
  std::vector<Held> owned(Slot slot) override { return even_share(slot); }
  // Ring all-reduce: 2(N-1)/N of the gradient bytes each way.
  TrafficTheory traffic_theory(int grad_accum) const override;

  // The algorithm the last step's last bucket all-reduce ran with, as
  // select.cc chose it (empty before the first communicating step).
  const comm::AlgorithmChoice& bucket_algorithm() const { return bucket_algorithm_; }

 private:
  void all_reduce_bucket(int bucket);
  std::optional<BucketTracker> tracker_;
  bool communicate_ = false;  // the step's last micro-batch
  std::vector<comm::Work> in_flight_;
  comm::AlgorithmChoice bucket_algorithm_;
};

}  // namespace braid::trainer
