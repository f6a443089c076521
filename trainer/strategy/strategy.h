// A data-parallel strategy: the only place that knows how ranks cooperate
// (DESIGN.md). The training loop (train/trainer.h) runs the micro-batches of
// this rank's share of the global batch through the strategy's model; the
// strategy, through the model's hooks and finish_step(), makes the gradients
// global, steps the optimizer and publishes the new parameters.
//
//   none   one process: today's single-process step
//   dp     parameter server: gradients reduced to rank 0, which steps and
//          broadcasts the parameters (dp.cc)
//   ddp    gradients all-reduced bucket by bucket during backward (ddp.cc)
//   zero1  optimizer state sharded; zero2 + gradients; zero3 + parameters
//          (zero.cc)
//
// Every rank seeds each of its targets' loss gradient with 1 / (tokens of
// the GLOBAL batch), so the SUM of the ranks' gradients is the gradient of
// the global mean loss: strategies sum, and averaging is already done.
//
// The training state is three slots (parameters, AdamW's m and v) indexed
// like the flat buffers. held() is every piece of a slot a rank stores;
// owned() is the part a rank answers for, and the owned parts of all ranks
// partition each slot. Initialisation and loading write whole tensors into
// what is held; checkpoints write what is owned.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "trainer/model/gpt.h"
#include "trainer/optim/adamw.h"
#include "trainer/strategy/comm_memory.h"
#include "trainer/strategy/dp_comm.h"

namespace braid::trainer {

enum class StrategyKind { kNone, kDp, kDdp, kZero1, kZero2, kZero3 };

// "none", "dp", "ddp", "zero1", "zero2", "zero3".
std::string_view strategy_name(StrategyKind kind);
// Throws InvalidUsage listing the choices.
StrategyKind parse_strategy(std::string_view text);

// Model parallelism's part in the gradient norm (mesh.h). Under TP and PP a
// rank holds part of the model: it counts the squares of the tensors it
// answers for (a tensor replicated over TP on tp_rank 0 only, the tied wte
// on the first stage only), and the sums are added over the other parts.
class ModelParallelNorm {
 public:
  virtual ~ModelParallelNorm() = default;
  virtual bool counts(const ParamView& view) const = 0;
  // Sums a square sum over the ranks that hold the rest of the model.
  virtual double sum_over_model(double square_sum) = 0;
};

// What a strategy is built from. `comm` is null only for kNone; under a
// mesh it is the DP group, `layout` the rank's TP slice and stage (default:
// the whole model) and `model_norm` the mesh.
struct StrategySetup {
  GptConfig model;
  AdamWConfig adamw;
  float grad_clip = 0.0f;          // max global norm; 0: off
  std::size_t bucket_bytes = 25u << 20;
  comm::Communicator* comm = nullptr;
  MemoryAccount* memory = nullptr;
  std::optional<ModelLayout> layout;
  ModelParallelNorm* model_norm = nullptr;
  // Where every buffer of the model, optimizer and strategy lives.
  Device device = Device::kCpu;
};

enum class Slot { kParams, kM, kV };

// A piece of one slot: table elements [range.offset, range.end()) stored
// from `data` on (in the memory of the strategy's device).
struct Held {
  Range range;
  float* data;
};

struct StepResult {
  double loss = 0.0;       // mean over the global batch's targets
  double grad_norm = 0.0;  // global, before clipping
};

// The ZeRO paper's memory table for one rank, in bytes (P parameters of 4
// bytes; AdamW's m and v are the optimizer state): none, ddp: 4P, 4P, 8P;
// dp: the same, optimizer state on rank 0 only; zero1: optimizer / N;
// zero2: + gradients / N; zero3: + parameters / N. Padding and staging
// buffers are not in it.
struct MemoryTheory {
  double params = 0.0;
  double grads = 0.0;
  double optimizer = 0.0;
};
MemoryTheory memory_theory(StrategyKind kind, int world_size, int rank, std::size_t param_count);

// Bytes one rank sends and receives per optimizer step through the
// transports of a ring (or chain) algorithm, and the same step in bus bytes
// (comm_meter.h: the calls' bytes as nccl-tests counts them, whatever
// algorithm runs them). They differ only for dp's chains, whose end ranks
// send less than the bus bytes of a reduce and a broadcast.
struct TrafficTheory {
  double sent = 0.0;
  double received = 0.0;
  std::string formula;  // "2(N-1)/N x 4P", for the reports
  double bus = 0.0;
};

class Strategy : public ModelHooks {
 public:
  explicit Strategy(const StrategySetup& setup);
  ~Strategy() override;
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  virtual StrategyKind kind() const = 0;
  // One line for the start of a run: buckets, shards, what moves when.
  virtual std::string describe() const = 0;
  int rank() const { return comm_ != nullptr ? comm_->rank() : 0; }
  int world_size() const { return comm_ != nullptr ? comm_->size() : 1; }
  Gpt& model() { return *model_; }
  const Backend& ops() const { return backend(setup_.device); }
  AdamW& optimizer() { return *optimizer_; }
  CommMeter& meter() { return meter_; }
  comm::Communicator* comm() { return comm_; }
  // Whether the buffers this strategy's collectives run on are registered
  // memory on every rank (comm_memory.h).
  bool buffers_registered() const { return comm_memory_.registers(); }

  // The step. begin_micro_batch() before each forward (index 0 zeroes the
  // gradients; `last` is the step's last micro-batch, where DDP and ZeRO-1
  // communicate). finish_step() after the last backward: `loss_sum` is this
  // rank's sum of target losses, `tokens` the global batch's target count.
  virtual void begin_micro_batch(int index, bool last);
  virtual StepResult finish_step(double loss_sum, double tokens, float lr, long step) = 0;
  // Under a pipeline the tied embedding is summed over the stages after the
  // last backward, and then this reduces what is still unreduced (ddp, zero1;
  // a no-op for none): a strategy that overlaps_pipeline() launches its
  // buckets during the last backward as usual, except those holding a unit
  // passed to hold_back_unit(), which this launches; one that does not runs
  // every micro-batch with last = false and reduces everything here.
  // finish_step() follows.
  virtual void reduce_after_backward();
  virtual bool overlaps_pipeline() const { return false; }
  // The gradient of `unit` is final only after the backward (the tied
  // embedding): its bucket waits for reduce_after_backward().
  virtual void hold_back_unit(int unit) { (void)unit; }
  // Before forward passes without backward (evaluation, generation).
  virtual void begin_forward_only() {}

  // The state (see the header comment).
  virtual std::vector<Held> held(Slot slot) = 0;
  virtual std::vector<Held> owned(Slot slot) = 0;
  // Stores the part of tensor `view` (values: its view.count() elements)
  // that this rank holds.
  void write_view(Slot slot, const ParamView& view, const float* values);
  // The whole tensor on every rank. Collective: every rank must call it.
  std::vector<float> read_view(Slot slot, const ParamView& view);
  // GPT-2 initialisation from `seed`, one tensor at a time.
  void init_params(std::uint64_t seed);

  // Sums over the ranks (evaluation losses, the run's totals).
  void sum_over_ranks(std::span<double> values);
  virtual TrafficTheory traffic_theory(int grad_accum) const = 0;

 protected:
  // Derived constructors build the model, then the optimizer over the
  // pieces of the model's table they own; both charge setup.memory.
  void build_model(ModelStorage storage);
  void build_optimizer(std::vector<Range> owned);
  // Every optimizer piece with its parameters and gradients in full flat
  // buffers (the pieces' table offsets).
  Held whole_params() { return {Range{0, model_->table().count()}, model_->params().data()}; }
  std::vector<Held> optimizer_pieces(Slot slot);
  // The owned part of a slot every rank holds in full: an even cut.
  std::vector<Held> even_share(Slot slot);
  // Clips by `norm` (the global norm) and steps every optimizer piece whose
  // parameters and gradients sit in the model's full buffers.
  void clip_and_update_full(double norm, float lr, long step);
  // The squares of the gradients in table range `range` (stored from
  // `grads` on) of every tensor this rank counts (ModelParallelNorm).
  double counted_square_sum(Range range, const float* grads) const;
  // The whole model's square sum from this rank's part of it.
  double sum_over_model(double square_sum) const;

  StrategySetup setup_;
  comm::Communicator* comm_;
  CommMeter meter_;
  // Where the buffers the collectives run on come from (comm_memory.h).
  CommMemory comm_memory_;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<AdamW> optimizer_;
};

// The single-process step (kNone): no communicator, no hooks.
class SingleStrategy : public Strategy {
 public:
  explicit SingleStrategy(const StrategySetup& setup);
  StrategyKind kind() const override { return StrategyKind::kNone; }
  std::string describe() const override { return "none: one process, no communication"; }
  StepResult finish_step(double loss_sum, double tokens, float lr, long step) override;
  std::vector<Held> held(Slot slot) override;
  std::vector<Held> owned(Slot slot) override { return held(slot); }
  TrafficTheory traffic_theory(int grad_accum) const override { return {0, 0, "0"}; }
};

}  // namespace braid::trainer
