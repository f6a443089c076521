// The mesh: the one place that composes the strategies, innermost first
// (picotron's shape). Tensor parallelism cuts each stage's blocks over the
// TP group (TpHooks: Megatron's f and g); pipeline parallelism runs the
// stage's blocks under a schedule (pp_schedule.h) over the PP group; a
// data-parallel strategy (none, ddp or zero1) reduces the gradients over the
// DP group, which is its whole world.
//
// One step on every rank:
//   1. run the schedule over this DP rank's M micro-batches;
//   2. pipeline only: sum the tied embedding's gradient over the first and
//      last stage, then let the DP strategy reduce every bucket (nothing was
//      reduced during backward: zero1's shards of wte would not line up
//      between the first and the last stage's tables). Without a pipeline
//      DDP and zero1 reduce from backward as usual;
//   3. the DP strategy clips by the global norm (counts() / sum_over_model():
//      TP-replicated tensors on tp_rank 0 only, wte on the first stage only,
//      summed over TP and PP) and steps;
//   4. the loss, known to the last stage, is summed over the pipeline.
//
// The mesh accepts none (one DP rank), ddp and zero1. dp, zero2 and zero3
// reduce or shard in ways the pipeline's tied embedding and TP's partial
// tables do not line up with; validate_mesh refuses them before any work.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "trainer/strategy/pp_schedule.h"
#include "trainer/strategy/process_groups.h"
#include "trainer/strategy/strategy.h"
#include "trainer/strategy/tp_comm.h"

namespace braid::trainer {

// Throws InvalidUsage, saying what to change, unless `kind` runs on the
// mesh `shape` (validate(shape, world) and mesh_model_layout's checks too).
void validate_mesh(const GptConfig& config, const MeshShape& shape, StrategyKind kind, int world_size);

// What one rank did in the steps so far, for the reports.
struct MeshTotals {
  // Schedule time summed over the steps after this Mesh's first, which
  // allocates and first touches the activations (a warm-up, as in benchmarks),
  // or over the first alone when it is the only one.
  std::chrono::duration<double> busy{}, idle{};
  std::int64_t timed_steps = 0;
  std::int64_t steps = 0;
  std::size_t peak_activation_bytes = 0;         // largest over the steps
  int peak_in_flight = 0;
};

class Mesh : public ModelParallelNorm {
 public:
  // Collective over `world`. `setup.comm`, `layout` and `model_norm` are
  // filled here; B x T is one micro-batch of this DP rank.
  Mesh(comm::Communicator& world, const MeshShape& shape, StrategyKind kind, StrategySetup setup,
       PpSchedule schedule, int B, int T);
  ~Mesh() override;

  Strategy& strategy() { return *strategy_; }
  const ProcessGroups& groups() const { return groups_; }
  PpSchedule schedule() const { return schedule_; }

  // One optimizer step over this DP rank's micro-batches (the header's
  // 1 to 4). `tokens`: targets of the global batch.
  StepResult step(std::span<const MicroBatch> micro_batches, float dloss, double tokens, float lr, long step);
  // The sum of the target losses of the micro-batches, forward only, summed
  // over the pipeline (not over DP).
  double forward_loss_sum(std::span<const MicroBatch> micro_batches);

  const PipelineStats& last_stats() const { return last_; }
  const MeshTotals& totals() const { return totals_; }
  // Time blocked in TP's all-reduces and in PP's sends and receives.
  std::chrono::duration<double> tp_blocked() const;
  std::chrono::duration<double> pp_blocked() const { return pipe_->blocked(); }
  // The TP and PP groups' counters so far (comm_meter.h): Megatron's f and
  // g with the step's sums over TP; the pipeline's sends, the tied
  // embedding's sum and the step's sums over PP.
  GroupTraffic tp_traffic() const;
  GroupTraffic pp_traffic() const;

  // A whole tensor (full_shape) of this stage from every DP and TP rank's
  // part. Collective over the stage's DP and TP groups.
  std::vector<float> read_whole(Slot slot, const ParamView& view);
  // One value per stage, ordered by stage (collective over the PP group).
  std::vector<double> gather_stages(double value);

  bool counts(const ParamView& view) const override;
  double sum_over_model(double square_sum) override;

 private:
  void sum_tied_embedding();
  double sum_over_pipeline(double value);

  ProcessGroups groups_;
  PpSchedule schedule_;
  std::unique_ptr<Strategy> strategy_;
  std::optional<TpHooks> tp_hooks_;
  std::optional<PipeComm> pipe_;
  std::optional<ActivationPool> pool_;
  PipelineStats last_;
  MeshTotals totals_;
};

}  // namespace braid::trainer
