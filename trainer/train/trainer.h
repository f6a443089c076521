// The training loop: a strategy (trainer/strategy/) with its GPT and AdamW,
// the byte corpus, the schedule, evaluations and checkpoints, with the
// trainer's own accounting of time, FLOPs, memory and communication. The
// strategy is the only part that knows about other ranks; everything here
// runs the same on every rank.
//
// One step s (counted from 0) with global batch B_g, N ranks, grad_accum A
// and per-rank micro-batch B = B_g / (N A): on rank r, for a in 0..A-1:
// samples [r A B + a B, r A B + (a+1) B) of step s, forward, backward with
// every target's loss gradient 1 / (B_g * T); then the strategy sums the
// gradients over the ranks, clips by the global norm and steps AdamW with
// lr = schedule(s) and step count s + 1. The reported loss is the mean over
// all B_g * T targets: the ranks' sums, summed.
//
// Under --tp / --pp the world is a mesh (strategy/mesh.h) and N above is
// the DP size: the ranks of one DP coordinate take the same samples, run
// the step's micro-batches through the pipeline schedule, and the mesh
// composes TP, PP and the DP strategy. Checkpoints of a mesh hold whole
// tensors (state_io.h), so they load into any layout.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "trainer/data/text_data.h"
#include "trainer/model/gpt.h"
#include "trainer/optim/adamw.h"
#include "trainer/strategy/mesh.h"
#include "trainer/strategy/strategy.h"
#include "trainer/train/evaluate.h"
#include "trainer/train/options.h"

namespace braid::trainer {

// One group's communication in a step as this rank sees it (a DP run has
// the DP group alone; groups of one rank move nothing).
struct GroupStep {
  int ranks = 1;
  double bus_bytes = 0.0;         // sent, counted at each call (comm_meter.h)
  double theory_bus_bytes = 0.0;  // from the model's shape (traffic_theory.h, Strategy::traffic_theory)
  double transport_bytes_sent = 0.0;
  double wait_ms = 0.0;           // blocked in the group's calls

  GroupStep& operator+=(const GroupStep& step);
};

// Indexed by MeshAxis: dp, tp, pp.
using GroupSteps = std::array<GroupStep, 3>;
inline GroupStep& group(GroupSteps& steps, MeshAxis axis) { return steps[static_cast<std::size_t>(axis)]; }
inline const GroupStep& group(const GroupSteps& steps, MeshAxis axis) {
  return steps[static_cast<std::size_t>(axis)];
}
std::string_view axis_name(MeshAxis axis);  // "dp", "tp", "pp"

struct StepReport {
  std::int64_t step = 0;    // steps completed, so the first is 1
  std::int64_t steps = 0;   // the run's total
  double loss = 0.0;
  float lr = 0.0f;
  double grad_norm = 0.0;   // before clipping
  double tokens_per_s = 0.0;
  double step_ms = 0.0;
  std::optional<double> val_loss;  // on evaluation steps
  const MemoryAccount* memory = nullptr;
  // This rank's communication during the step.
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  double comm_wait_ms = 0.0;       // blocked in Communicator calls and Work::wait
  TrafficTheory theory;            // bytes per step the strategy should move
  GroupSteps groups;               // every group's traffic: bus and transport bytes, theory, wait
  // Under --tp / --pp (mesh): this rank's stage in the step.
  bool mesh = false;
  double bubble = 0.0;             // measured: idle / the step's pipeline window
  double bubble_theory = 0.0;      // (P-1) / (M+P-1)
  std::size_t peak_activation_bytes = 0;
  double tp_comm_ms = 0.0;         // blocked in TP's all-reduces
  double pp_comm_ms = 0.0;         // blocked in PP's sends and receives
};

// The mesh's part of the summary: per stage (index = stage), from the
// ranks of rank 0's DP and TP coordinate.
struct MeshSummary {
  MeshShape shape;
  std::string schedule;
  int micro_batches = 0;
  std::vector<double> bubble;                 // measured idle fraction over the run's steps
  double bubble_theory = 0.0;
  std::vector<double> compute_ms_per_step;    // forward + backward of the stage
  std::vector<double> peak_activation_bytes;
  std::vector<double> tp_comm_ms_per_step;
  std::vector<double> pp_comm_ms_per_step;
};

// This rank's communication over the steps of one invocation.
struct CommTotals {
  std::int64_t steps = 0;
  double bytes_sent = 0.0;
  double bytes_received = 0.0;
  double wait_seconds = 0.0;
  double step_seconds = 0.0;
  double tp_wait_seconds = 0.0;  // mesh: blocked in TP's all-reduces
  double pp_wait_seconds = 0.0;  // mesh: blocked in PP's sends and receives
  GroupSteps groups;             // summed over the steps
};

struct TrainSummary {
  std::int64_t steps_run = 0;     // by this invocation
  std::int64_t tokens = 0;        // trained on by this invocation (all ranks)
  double train_seconds = 0.0;     // optimizer steps only: no eval, no checkpoint
  double train_loss = 0.0;        // final evaluation on eval_batches of each split
  double val_loss = 0.0;
  double tokens_per_s = 0.0;
  double flops_per_token = 0.0;   // flops_per_token() below
  double gflops = 0.0;            // achieved, all ranks
  double peak_gflops = 0.0;       // of the device(s) the ranks run on (Backend::peak_gflops)
  std::string peak_source;        // how peak_gflops was found
  double mfu = 0.0;               // gflops / peak_gflops
  const MemoryAccount* memory = nullptr;
  int ranks = 1;
  CommTotals comm;                // this rank's
  std::optional<MeshSummary> mesh;  // under --tp / --pp
};

// Training FLOPs per token (forward + backward), as PaLM / nanoGPT count
// them: 6 * N + 12 * n_layer * n_embd * T, where N counts the parameters
// that multiply (all but wpe, a lookup; the tied wte once, for the head)
// and the second term is attention's q.k and att.v products over the full
// T x T (the causal half is not subtracted).
double flops_per_token(const GptConfig& config, std::size_t param_count);

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_step(const StepReport& report) {}
  // Before the checkpoint of `step` is written (every rank).
  virtual void before_checkpoint(std::int64_t step) {}
  virtual void on_checkpoint(const std::filesystem::path& dir, std::int64_t step) {}
};

class Trainer {
 public:
  // Validates the options against the corpus and the world, and that every
  // rank read the same corpus (collective) (InvalidUsage),
  // builds the strategy (--strategy, or none / ddp by DP size) with its
  // model and optimizer; under --tp / --pp inside the mesh (mesh.h). `comm` is null for one process without a
  // communicator; the corpus and the communicator must outlive the trainer.
  Trainer(const TrainOptions& options, const TextCorpus& corpus, comm::Communicator* comm = nullptr);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Weights from --resume, --init-from or the seed; writes --init-out.
  void start();
  // One optimizer step (see the header comment); returns its report
  // without timing or evaluation.
  StepReport train_step();
  // Steps until options.steps, then a final evaluation.
  TrainSummary run(TrainObserver& observer);

  double evaluate_train() { return evaluate(*train_eval_); }
  double evaluate_val() { return evaluate(*val_); }
  // --eval-only over the whole corpus (one process).
  WindowLoss evaluate_windows() { return window_loss(model(), *acts_, corpus_.bytes); }
  std::filesystem::path save_checkpoint();

  Strategy& strategy() { return mesh_ ? mesh_->strategy() : *strategy_; }
  // Null without --tp / --pp.
  Mesh* mesh() { return mesh_.get(); }
  // In the world (the strategy's rank is its DP rank).
  int rank() const { return world_ != nullptr ? world_->rank() : 0; }
  int world_size() const { return world_ != nullptr ? world_->size() : 1; }
  comm::Communicator* world() { return world_; }
  Gpt& model() { return strategy().model(); }
  AdamW& optimizer() { return strategy().optimizer(); }
  std::int64_t step() const { return step_; }
  const MemoryAccount& memory() const { return memory_; }
  const TrainOptions& options() const { return options_; }
  const CommTotals& comm_totals() const { return totals_; }
  // A group's bus bytes per step in theory, and the formula (traffic_theory.h).
  const TrafficTheory& group_theory(MeshAxis axis) const { return group_theory_[static_cast<std::size_t>(axis)]; }
  // The size of this rank's group along `axis` (the DP size without a mesh).
  int group_size(MeshAxis axis);

 private:
  double evaluate(const BatchSampler& sampler);
  double pipeline_loss_sum(const BatchSampler& sampler);
  double accumulate_micro_batches(std::int64_t first);
  StepResult mesh_step(std::int64_t first, double tokens, float lr);
  void add_mesh_report(StepReport& report);
  // Every group's counters now (comm_meter.h), indexed by MeshAxis, and the
  // step's share of each since `before`.
  std::array<GroupTraffic, 3> group_counters();
  GroupSteps group_steps(const std::array<GroupTraffic, 3>& before);
  MeshSummary mesh_summary();
  bool checkpoint_due() const;  // an interval checkpoint of this step is to be written
  void maybe_checkpoint(TrainObserver& observer, bool final_step);

  TrainOptions options_;
  const TextCorpus& corpus_;
  MemoryAccount memory_;
  comm::Communicator* world_;
  std::unique_ptr<Mesh> mesh_;          // --tp / --pp
  std::unique_ptr<Strategy> strategy_;  // otherwise
  int B_;                               // sequences per micro-batch on this rank
  std::optional<Activations> acts_;     // without a mesh
  std::array<TrafficTheory, 3> group_theory_;  // per step, indexed by MeshAxis
  LrSchedule schedule_;
  std::optional<BatchSampler> train_, train_eval_, val_;
  std::vector<std::int32_t> inputs_, targets_;
  std::int64_t step_ = 0;
  std::int64_t last_checkpoint_ = -1;
  CommTotals totals_;
};

}  // namespace braid::trainer
