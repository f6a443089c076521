// ZeRO stages 1 to 3 (Rajbhandari et al., SC 2020) over one partition
// (zero_comm.h): rank r owns chunk r of every group of units.
//
//   zero1  optimizer state sharded. Full gradients accumulate locally; on
//          the last micro-batch each bucket is reduce-scattered in place as
//          backward completes it. Each rank steps its chunks (m and v exist
//          only for them), then every bucket's parameters are all-gathered
//          in place.
//   zero2  gradients sharded too: no full gradient buffer. Backward writes
//          into staging buckets, reduce-scattered as they complete on EVERY
//          micro-batch (nothing else could hold an accumulated gradient);
//          the shard accumulates. Then as zero1.
//   zero3  parameters sharded too; groups are single units. Each unit is
//          all-gathered before its forward and again before its backward,
//          the next one prefetched, and freed after use. The step updates
//          the shards in place; nothing is gathered after it.
//
// Under a pipeline (mesh.h) zero1 reduce-scatters its buckets during each
// stage's last backward as without one, except the bucket holding the tied
// embedding, which waits for the sum over the stages (reduce_after_backward);
// zero2 and zero3 are refused there, since their per-micro-batch reductions
// cannot wait for it.
//
// Clipping: each rank sums the squares of its shard of the reduced
// gradients; one all-reduce of [loss sum, squared norm] gives the global
// norm, the same as one process's up to summation order.
#pragma once

#include <optional>
#include <vector>

#include "trainer/strategy/strategy.h"
#include "trainer/strategy/zero_comm.h"

namespace braid::trainer {

class ZeroStrategy : public Strategy {
 public:
  ZeroStrategy(const StrategySetup& setup, int stage);
  StrategyKind kind() const override;
  std::string describe() const override;

  void begin_micro_batch(int index, bool last) override;
  void begin_forward_only() override;
  void before_unit(int unit, Pass pass) override;
  void after_unit(int unit, Pass pass) override;
  float* unit_params(int unit) override;
  float* unit_grads(int unit) override;
  void grads_ready(int unit, Range grads) override;
  void reduce_after_backward() override;
  bool overlaps_pipeline() const override { return stage_ == 1; }
  void hold_back_unit(int unit) override;
  StepResult finish_step(double loss_sum, double tokens, float lr, long step) override;

  std::vector<Held> held(Slot slot) override;
  std::vector<Held> owned(Slot slot) override;
  // zero1: reduce-scatter + all-gather, 2(N-1)/N; zero2: a reduce-scatter
  // per micro-batch, (A+1)(N-1)/N; zero3: two gathers and a reduce-scatter
  // per micro-batch, 3A(N-1)/N; of the (padded) parameter bytes.
  TrafficTheory traffic_theory(int grad_accum) const override;

 private:
  // Where chunk g's gradients and parameters are.
  float* shard_grads(std::size_t g);
  float* shard_params(std::size_t g);
  void reduce_scatter_bucket(int group);  // zero1, in place in the full gradients
  void all_gather_params();               // zero1 and zero2, in place
  void register_buffers();                // comm_memory.h
  double shard_square_sum();

  int stage_;
  std::optional<ZeroPartition> partition_;
  std::optional<ShardedGradients> grads_;    // zero2, zero3
  std::optional<UnitGatherer> params_;       // zero3
  std::optional<BucketTracker> tracker_;     // zero1
  bool communicate_ = false;                 // zero1: the step's last micro-batch
  std::vector<comm::Work> in_flight_;        // zero1's reduce-scatters
};

}  // namespace braid::trainer
