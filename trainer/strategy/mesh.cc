#include "trainer/strategy/mesh.h"

#include "runtime/errors.h"
#include "trainer/strategy/compose.h"

namespace braid::trainer {

namespace {

void sum_over(CommMeter& group, std::span<double> values) {
  if (group.size() == 1) return;
  group.run([&](CommMeter::Calls& c) {
    return c.all_reduce(values.data(), values.data(), values.size(), DataType::f64, ReduceOp::sum);
  });
}

bool model_parallel(const MeshShape& shape) { return shape.tp > 1 || shape.pp > 1; }

}  // namespace

void validate_mesh(const GptConfig& config, const MeshShape& shape, StrategyKind kind, int world_size) {
  validate(shape, world_size);
  for (int pp = 0; pp < shape.pp; ++pp) mesh_model_layout(config, shape, MeshCoord{0, 0, pp});
  const bool supported = kind == StrategyKind::kDdp || kind == StrategyKind::kZero1 ||
                         (kind == StrategyKind::kNone && shape.dp == 1);
  if (model_parallel(shape) && kind == StrategyKind::kNone && shape.dp > 1) {
    throw InvalidUsage("--strategy none does not keep data-parallel replicas in step, so with --tp / --pp it runs "
                       "only at dp 1, and this layout has dp " + std::to_string(shape.dp) + " (--tp " + std::to_string(shape.tp) +
                       " --pp " + std::to_string(shape.pp) + "): pass --dp 1 with as many ranks as tp x pp, or "
                       "--strategy ddp or zero1");
  }
  if (model_parallel(shape) && !supported) {
    throw InvalidUsage("--strategy " + std::string(strategy_name(kind)) + " does not run with --tp " +
                       std::to_string(shape.tp) + " --pp " + std::to_string(shape.pp) +
                       " (dp, zero2 and zero3 shard or reduce in ways the tied embedding and the TP slices do "
                       "not line up with); use --strategy ddp or zero1" +
                       std::string(shape.dp == 1 ? ", or none" : ", or none with --dp 1"));
  }
}

Mesh::Mesh(comm::Communicator& world, const MeshShape& shape, StrategyKind kind, StrategySetup setup,
           PpSchedule schedule, int B, int T)
    : groups_(ProcessGroups::build(world, shape)), schedule_(schedule) {
  setup.comm = kind == StrategyKind::kNone ? nullptr : groups_.dp_group.get();
  setup.layout = mesh_model_layout(setup.model, shape, groups_.coord);
  setup.model_norm = this;
  strategy_ = make_strategy(kind, setup);
  Gpt& model = strategy_->model();
  if (shape.tp > 1) model.set_hooks(&tp_hooks_.emplace(*groups_.tp_group, strategy_.get()));
  pipe_.emplace(*groups_.pp_group);
  // The unit holding the tied wte (the embedding's on the first stage, the
  // head's on the last) is final only after the sum over the stages.
  if (shape.pp > 1 && model.table().contains("wte.weight"))
    strategy_->hold_back_unit(model.table().find("wte.weight").unit);
  pool_.emplace(model, B, T);
  model.reserve_scratch(B, T);
}

Mesh::~Mesh() {
  if (strategy_) strategy_->model().set_hooks(nullptr);
}

StepResult Mesh::step(std::span<const MicroBatch> micro_batches, float dloss, double tokens, float lr, long step) {
  const int M = static_cast<int>(micro_batches.size());
  const bool pipeline = groups_.shape.pp > 1;
  // Index 0 zeroes the gradients; without a pipeline DDP and zero1 reduce
  // from the last backward, with one after the tied embedding is summed.
  // DDP reduces its buckets during the last backward, pipeline or not; the
  // bucket holding the tied embedding waits for the sum over the stages
  // (held back in the constructor).
  const bool reduce_in_backward = !pipeline || strategy_->overlaps_pipeline();
  const PipelineCallbacks callbacks{
      {}, [&](int i) { strategy_->begin_micro_batch(i, reduce_in_backward && i == M - 1); }};
  pool_->reset_peaks();
  last_ = run_pp_schedule(schedule_, strategy_->model(), *pipe_, *pool_, micro_batches, dloss, callbacks);
  if (totals_.steps++ == 1) totals_.busy = totals_.idle = {}, totals_.timed_steps = 0;
  totals_.busy += last_.busy;
  totals_.idle += last_.idle;
  ++totals_.timed_steps;
  totals_.peak_activation_bytes = std::max(totals_.peak_activation_bytes, last_.peak_activation_bytes);
  totals_.peak_in_flight = std::max(totals_.peak_in_flight, last_.peak_in_flight);
  if (pipeline) {
    sum_tied_embedding();
    strategy_->reduce_after_backward();
  }
  StepResult result = strategy_->finish_step(last_.loss_sum, tokens, lr, step);
  result.loss = sum_over_pipeline(pipe_->is_last_stage() ? result.loss : 0.0);
  return result;
}

double Mesh::forward_loss_sum(std::span<const MicroBatch> micro_batches) {
  strategy_->begin_forward_only();
  const PipelineStats stats = pp_forward_only(strategy_->model(), *pipe_, *pool_, micro_batches);
  return sum_over_pipeline(stats.loss_sum);
}

void Mesh::sum_tied_embedding() {
  const Gpt& model = strategy_->model();
  const GptConfig& c = model.config();
  float* wte = model.table().contains("wte.weight")
                   ? strategy_->model().grads().data() + model.table().find("wte.weight").offset
                   : nullptr;
  pipe_->sum_tied_embedding_grads(wte, static_cast<std::size_t>(c.vocab_size) * c.n_embd);
}

double Mesh::sum_over_pipeline(double value) {
  sum_over(pipe_->meter(), {&value, 1});
  return value;
}

std::chrono::duration<double> Mesh::tp_blocked() const { return tp_traffic().blocked; }

GroupTraffic Mesh::tp_traffic() const { return tp_hooks_ ? tp_hooks_->meter().snapshot() : GroupTraffic{}; }

GroupTraffic Mesh::pp_traffic() const { return pipe_->traffic(); }

bool Mesh::counts(const ParamView& view) const {
  const bool tp_counts = view.tp_split != TpSplit::kReplicated || groups_.coord.tp == 0;
  const bool tied_copy = view.name == "wte.weight" && !strategy_->model().layout().pp_is_first_stage;
  return tp_counts && !tied_copy;
}

double Mesh::sum_over_model(double square_sum) {
  if (tp_hooks_) sum_over(tp_hooks_->meter(), {&square_sum, 1});
  sum_over(pipe_->meter(), {&square_sum, 1});
  return square_sum;
}

std::vector<float> Mesh::read_whole(Slot slot, const ParamView& view) {
  const std::vector<float> local = strategy_->read_view(slot, view);
  return tp_gather_tensor(*groups_.tp_group, view, local.data());
}

std::vector<double> Mesh::gather_stages(double value) {
  comm::Communicator& pp = *groups_.pp_group;
  std::vector<double> all(static_cast<std::size_t>(pp.size()), value);
  if (pp.size() > 1) pp.all_gather(&value, all.data(), 1, DataType::f64).wait();
  return all;
}

}  // namespace braid::trainer
