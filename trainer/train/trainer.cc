#include "trainer/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include <spdlog/spdlog.h>

#include "kernels/cpu/gpt_ops.h"
#include "runtime/errors.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/layout.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/strategy/compose.h"
#include "trainer/strategy/traffic_theory.h"
#include "trainer/train/peak.h"
#include "trainer/train/resume.h"
#include "trainer/train/state_io.h"

namespace braid::trainer {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string_view axis_name(MeshAxis axis) {
  return axis == MeshAxis::kDp ? "dp" : axis == MeshAxis::kTp ? "tp" : "pp";
}

GroupStep& GroupStep::operator+=(const GroupStep& o) {
  ranks = o.ranks;
  bus_bytes += o.bus_bytes;
  theory_bus_bytes += o.theory_bus_bytes;
  transport_bytes_sent += o.transport_bytes_sent;
  wait_ms += o.wait_ms;
  return *this;
}

double flops_per_token(const GptConfig& c, std::size_t param_count) {
  const double multiplying = static_cast<double>(param_count) - static_cast<double>(c.block_size) * c.n_embd;
  return 6.0 * multiplying + 12.0 * c.n_layer * c.n_embd * static_cast<double>(c.block_size);
}

namespace {

// The pipeline's evaluation runs its micro-batches in groups of at most
// this many (or --grad-accum, whose batches are held anyway), so that the
// tokens it holds do not grow with --eval-batches.
constexpr int kEvalGroup = 64;

int pipeline_eval_group(const TrainOptions& o) { return std::max(o.grad_accum, std::min(o.eval_batches, kEvalGroup)); }

// A --checkpoint-dir that cannot hold checkpoints (a file, a directory
// that cannot be created or written) is refused before the first step: at
// the first save it cost the training it was there to keep.
// A resumed run not given --checkpoint-dir writes beside the checkpoint it
// resumes (resume.h), and the refusal said "--checkpoint-dir" all the same.
void check_checkpoint_dir(const TrainOptions& o) {
  const std::string& dir = o.checkpoint_dir;
  std::error_code ec;
  const bool beside = !o.resume.empty() && fs::equivalent(checkpoint_home(resolve_checkpoint(o.resume)), dir, ec);
  const std::string what = beside ? "the directory of the checkpoint this run resumes, " + dir +
                                        ", where it writes its own unless given --checkpoint-dir,"
                                  : "--checkpoint-dir " + dir;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw InvalidUsage(what + " cannot hold checkpoints: " +
                       (ec ? ec.message() : std::string("it is not a directory")));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InvalidUsage(what + " cannot hold checkpoints: " + std::strerror(errno));
}

const TrainOptions& checked(const TrainOptions& o, const TextCorpus& corpus, int world_size) {
  validate(o);
  if (o.eval_only) {
    validate_world(o, 1);
    validate_data(o, corpus.bytes.size(), 0);
  } else {
    validate_world(o, world_size);
    Split s = split(corpus);
    validate_data(o, s.train.size(), s.val.size());
    if (!o.checkpoint_dir.empty()) check_checkpoint_dir(o);
  }
  return o;
}

StrategySetup strategy_setup(const TrainOptions& o, MemoryAccount* memory) {
  StrategySetup setup;
  setup.model = o.model;
  setup.adamw = AdamWConfig{0.9f, 0.95f, 1e-8f, o.weight_decay};
  setup.grad_clip = o.grad_clip;
  setup.bucket_bytes = static_cast<std::size_t>(o.bucket_mb * (1 << 20));
  setup.memory = memory;
  setup.device = parse_device(o.device);
  return setup;
}

StrategyKind strategy_kind(const TrainOptions& o, int dp_size) {
  return parse_strategy(strategy_or_default(o.strategy, dp_size));
}

std::unique_ptr<Strategy> build_strategy(const TrainOptions& o, comm::Communicator* comm, MemoryAccount* memory) {
  const int world = comm != nullptr ? comm->size() : 1;
  const StrategyKind kind = strategy_kind(o, world);
  StrategySetup setup = strategy_setup(o, memory);
  setup.comm = kind == StrategyKind::kNone && world == 1 ? nullptr : comm;
  return make_strategy(kind, setup);
}

// --tp / --pp: the mesh over the world, checked before any work.
std::unique_ptr<Mesh> build_mesh(const TrainOptions& o, comm::Communicator* world, MemoryAccount* memory, int B) {
  if (world == nullptr) throw InvalidUsage("--tp and --pp need ranks; start braid-train under braid-launch");
  const MeshShape shape{o.dp_size(world->size()), o.tp, o.pp};
  const StrategyKind kind = strategy_kind(o, shape.dp);
  validate_mesh(o.model, shape, kind, world->size());
  return std::make_unique<Mesh>(*world, shape, kind, strategy_setup(o, memory), parse_pp_schedule(o.schedule), B,
                                o.model.block_size);
}

// Every rank reads --data itself (on its own node, from its own working
// directory), but the sampler takes any sample of any step from one corpus.
// Ranks that read different bytes would train, silently, a model no single
// process trains (and the checkpoint would record rank 0's data alone):
// every rank compares every rank's size and fingerprint, so all refuse alike.
void check_same_data(comm::Communicator* world, const TextCorpus& corpus) {
  if (world == nullptr || world->size() == 1) return;
  const std::array<std::int64_t, 2> mine{static_cast<std::int64_t>(corpus.bytes.size()),
                                         static_cast<std::int64_t>(corpus.fingerprint())};
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(world->size()));
  world->all_gather(mine.data(), all.data(), mine.size(), DataType::i64).wait();
  for (int r = 1; r < world->size(); ++r) {
    const std::int64_t* other = all.data() + 2 * r;
    if (other[0] == all[0] && other[1] == all[1]) continue;
    const std::string what = other[0] != all[0] ? std::to_string(other[0]) + " bytes of data, rank 0 " +
                                                      std::to_string(all[0])
                                                : "as many bytes of data as rank 0 but other bytes";
    throw InvalidUsage("rank " + std::to_string(r) + " read " + what + " (this rank, " +
                       std::to_string(world->rank()) + ", read " + corpus.source +
                       "); every rank must train on the same data: give --data a file with the same contents "
                       "on every node");
  }
}

// What every rank must be told alike: the settings that repeat the run
// (config_json) less --data's path (check_same_data compares its bytes),
// and the others that change what a rank computes or which collectives it
// calls. Not the per-invocation ones that only change what a rank prints
// or writes, nor --threads.
nlohmann::json shared_settings(const TrainOptions& o) {
  nlohmann::json j = config_json(o);
  j.erase("data");
  j["device"] = o.device;
  j["eval_only"] = o.eval_only;
  j["resume"] = !o.resume.empty();
  j["resume_step"] = o.resume_step;
  j["init_from"] = !o.init_from.empty();
  j["sample"] = o.sample_bytes;
  j["temperature"] = o.temperature;
  // Any bytes make a prompt (the model is byte-level), and JSON holds only
  // UTF-8: its checksum (a prompt such as $'\xe9' failed every run of 2 ranks).
  j["prompt_xxh3"] = xxh3_hex(o.prompt.data(), o.prompt.size());
  // Where a rank writes may differ (a mount point of each node's own), but
  // not whether it does: every rank writes a shard of each step.
  j["checkpoint_dir_given"] = !o.checkpoint_dir.empty();
  // Rank 0 writes --init-out, gathering every rank's weights: given to one
  // rank only, the others called the next collective instead, a mismatch
  // named in collectives' terms (a review helper's case).
  j["init_out_given"] = !o.init_out.empty();
  return j;
}

// Nodes started with another --seed, --lr or model silently trained copies
// that differ (each rank initialises its own weights, as rank 0 would), and
// exited 0. Every rank gathers every rank's settings, so all refuse alike,
// naming each difference.
void check_same_settings(comm::Communicator* world, const TrainOptions& options) {
  if (world == nullptr || world->size() == 1) return;
  const int n = world->size();
  const std::string mine = shared_settings(options).dump();
  const std::int64_t length = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(n));
  world->all_gather(&length, lengths.data(), 1, DataType::i64).wait();
  const std::size_t width = static_cast<std::size_t>(*std::max_element(lengths.begin(), lengths.end()));
  std::string padded = mine;
  padded.resize(width, '\0');
  std::string all(width * static_cast<std::size_t>(n), '\0');
  world->all_gather(padded.data(), all.data(), width, DataType::u8).wait();
  auto settings_of = [&](int r) {
    return nlohmann::json::parse(all.substr(static_cast<std::size_t>(r) * width,
                                            static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)])));
  };
  const nlohmann::json first = settings_of(0);
  for (int r = 1; r < n; ++r) {
    const nlohmann::json theirs = settings_of(r);
    if (theirs == first) continue;
    std::string differences;
    for (const auto& [key, value] : first.items()) {
      if (theirs.contains(key) && theirs.at(key) == value) continue;
      differences += (differences.empty() ? "" : ", ") + key + " " +
                     (theirs.contains(key) ? theirs.at(key).dump() : std::string("(none)")) + " (rank 0: " +
                     value.dump() + ")";
    }
    if (theirs.value("resume_step", -1) != first.value("resume_step", -1) && theirs.value("resume", false))
      throw InvalidUsage("rank " + std::to_string(r) + " resumes from step " + theirs["resume_step"].dump() +
                         ", rank 0 from step " + first["resume_step"].dump() + ": the checkpoint's `latest` "
                         "moved while the ranks read it (another run writing into that directory?), or the ranks "
                         "were given different checkpoints; pass one step directory (--resume DIR/step_N)");
    throw InvalidUsage("rank " + std::to_string(r) + " was started with other settings than rank 0: " +
                       differences + "; every rank must be given the same training settings");
  }
}

// Ranks given checkpoints or weights files that differ (two runs' --resume
// directories, another --init-from on one node) each loaded their own and
// trained them as one model, averaging their gradients, and exited 0: the
// settings check sees only that a file was given, and the paths may
// rightly differ (each node's own copy). Every rank gathers what every
// rank's files hold (CheckpointReader::fingerprint), so all refuse alike.
void check_same_start(comm::Communicator* world, const std::string& flag, std::uint64_t fingerprint) {
  if (world == nullptr || world->size() == 1) return;
  std::vector<std::uint64_t> all(static_cast<std::size_t>(world->size()));
  world->all_gather(&fingerprint, all.data(), 1, DataType::i64).wait();
  std::string differ;
  int count = 0;
  for (int r = 1; r < world->size(); ++r) {
    if (all[static_cast<std::size_t>(r)] == all[0]) continue;
    differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    ++count;
  }
  if (count == 0) return;
  throw InvalidUsage((count == 1 ? "rank " : "ranks ") + differ + " read another " + flag + " than rank 0 (" +
                     (count == 1 ? "its files hold" : "their files hold") +
                     " other weights or another step): every rank must start from the same checkpoint; give each "
                     "one the same directory or file, or copies of it");
}

double ms(std::chrono::duration<double> d) { return d.count() * 1e3; }

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

Trainer::Trainer(const TrainOptions& options, const TextCorpus& corpus, comm::Communicator* comm)
    : options_(checked(options, corpus, comm != nullptr ? comm->size() : 1)),
      corpus_(corpus),
      world_(comm),
      B_(options_.rank_micro_batch(options_.dp_size(world_size()))),
      schedule_{options.lr, options.min_lr, options.warmup_steps, options.steps} {
  const int T = options_.model.block_size;
  check_same_settings(world_, options_);
  check_same_data(world_, corpus_);
  if (options_.model_parallel()) {
    mesh_ = build_mesh(options_, comm, &memory_, B_);
  } else {
    strategy_ = build_strategy(options_, comm, &memory_);
    acts_.emplace(model().make_activations(B_, T));
    model().reserve_scratch(B_, T);
  }
  if (!options_.eval_only) {
    Split s = split(corpus_);
    train_.emplace(s.train, T, options_.seed, SampleStream::kTrain);
    train_eval_.emplace(s.train, T, options_.seed, SampleStream::kTrainEval);
    val_.emplace(s.val, T, options_.seed, SampleStream::kVal);
  }
  const StepShape step{options_.grad_accum, B_, T};
  group_theory_ = {strategy().traffic_theory(options_.grad_accum),
                   tp_traffic_theory(options_.model, model().layout(), step),
                   pp_traffic_theory(options_.model, model().layout(), options_.pp, step)};
  const int batches = mesh_ ? pipeline_eval_group(options_) : 1;
  inputs_.resize(static_cast<std::size_t>(batches) * B_ * T);
  targets_.resize(inputs_.size());
}

void Trainer::start() {
  if (!options_.resume.empty()) {
    const fs::path dir = resolve_checkpoint(options_.resume);
    const CheckpointReader reader = CheckpointReader::open(dir);
    check_same_start(world_, "--resume", reader.fingerprint());
    load_state(reader, dir, strategy(), true);
    const TrainState& s = reader.state();
    step_ = last_checkpoint_ = s.step;
    if (s.data_bytes != corpus_.bytes.size() || s.data_fingerprint != corpus_.fingerprint()) {
      spdlog::warn("the data ({}) differs from the data this checkpoint was trained on ({}); "
                   "the resumed run will not reproduce the original", corpus_.source, s.data_source);
    }
    spdlog::info("resumed from {} ({} rank(s), {}) at step {}", dir.string(), reader.world_size(),
                 reader.strategy(), step_);
  } else if (!options_.init_from.empty() && fs::is_directory(options_.init_from)) {
    // A checkpoint directory (its latest step) or one step directory, of
    // any layout: the weights only.
    const fs::path dir = resolve_checkpoint(options_.init_from);
    const CheckpointReader reader = CheckpointReader::open(dir);
    check_same_start(world_, "--init-from", reader.fingerprint());
    load_state(reader, dir, strategy(), false);
    spdlog::info("initial weights from the checkpoint {}", dir.string());
  } else if (!options_.init_from.empty()) {
    const CheckpointReader reader = CheckpointReader::weights(options_.init_from);
    check_same_start(world_, "--init-from", reader.fingerprint());
    load_state(reader, options_.init_from, strategy(), false);
    spdlog::info("initial weights from {}", options_.init_from);
  } else {
    strategy().init_params(options_.seed);
  }
  if (!options_.init_out.empty()) {
    save_strategy_weights(strategy(), options_.init_out, step_);
    spdlog::info("wrote the initial weights to {}", options_.init_out);
  }
}

double Trainer::accumulate_micro_batches(std::int64_t first) {
  const int A = options_.grad_accum, T = options_.model.block_size;
  // Every target of the global batch weighs the same in the mean loss.
  const auto dloss = static_cast<float>(1.0 / (static_cast<double>(options_.batch_size) * T));
  double loss_sum = 0.0;
  for (int a = 0; a < A; ++a) {
    strategy_->begin_micro_batch(a, a == A - 1);
    train_->fill(step_, first + static_cast<std::int64_t>(a) * B_, B_, inputs_.data(), targets_.data());
    acts_->set_shape(B_, T);
    loss_sum += static_cast<double>(model().forward(*acts_, inputs_.data(), targets_.data())) * B_ * T;
    model().backward(*acts_, dloss);
  }
  return loss_sum;
}

StepResult Trainer::mesh_step(std::int64_t first, double tokens, float lr) {
  const int T = options_.model.block_size;
  const std::size_t N = static_cast<std::size_t>(B_) * T;
  std::vector<MicroBatch> micro_batches;
  for (int a = 0; a < options_.grad_accum; ++a) {
    std::int32_t* in = inputs_.data() + a * N;
    std::int32_t* tg = targets_.data() + a * N;
    train_->fill(step_, first + static_cast<std::int64_t>(a) * B_, B_, in, tg);
    micro_batches.push_back({in, tg, B_, T});
  }
  return mesh_->step(micro_batches, static_cast<float>(1.0 / tokens), tokens, lr, static_cast<long>(step_ + 1));
}

void Trainer::add_mesh_report(StepReport& r) {
  const PipelineStats& s = mesh_->last_stats();
  r.mesh = true;
  r.bubble = s.bubble_fraction();
  r.bubble_theory = pp_bubble_theory(options_.pp, options_.grad_accum);
  r.peak_activation_bytes = s.peak_activation_bytes;
  r.tp_comm_ms = group(r.groups, MeshAxis::kTp).wait_ms;
  r.pp_comm_ms = group(r.groups, MeshAxis::kPp).wait_ms;
}

int Trainer::group_size(MeshAxis axis) {
  if (!mesh_) return axis == MeshAxis::kDp ? strategy().world_size() : 1;
  const MeshShape& s = mesh_->groups().shape;
  return axis == MeshAxis::kDp ? s.dp : axis == MeshAxis::kTp ? s.tp : s.pp;
}

std::array<GroupTraffic, 3> Trainer::group_counters() {
  std::array<GroupTraffic, 3> now{};
  now[static_cast<std::size_t>(MeshAxis::kDp)] = strategy().meter().snapshot();
  if (mesh_) {
    now[static_cast<std::size_t>(MeshAxis::kTp)] = mesh_->tp_traffic();
    now[static_cast<std::size_t>(MeshAxis::kPp)] = mesh_->pp_traffic();
  }
  return now;
}

GroupSteps Trainer::group_steps(const std::array<GroupTraffic, 3>& before) {
  const std::array<GroupTraffic, 3> now = group_counters();
  GroupSteps steps;
  for (MeshAxis axis : {MeshAxis::kDp, MeshAxis::kTp, MeshAxis::kPp}) {
    const auto i = static_cast<std::size_t>(axis);
    const GroupTraffic d = now[i] - before[i];
    steps[i] = {group_size(axis), d.bus_bytes, group_theory_[i].bus, static_cast<double>(d.transport.bytes_sent),
                ms(d.blocked)};
  }
  return steps;
}

StepReport Trainer::train_step() {
  const int A = options_.grad_accum, T = options_.model.block_size;
  const double tokens = static_cast<double>(options_.batch_size) * T;
  const int dp_rank = mesh_ ? mesh_->groups().coord.dp : strategy().rank();
  const std::int64_t first = static_cast<std::int64_t>(dp_rank) * A * B_;
  const std::array<GroupTraffic, 3> before = group_counters();
  const float lr = schedule_.at(step_);
  const StepResult result =
      mesh_ ? mesh_step(first, tokens, lr)
            : strategy_->finish_step(accumulate_micro_batches(first), tokens, lr, static_cast<long>(step_ + 1));
  if (!std::isfinite(result.loss)) {
    throw Error("the loss became " + std::to_string(result.loss) + " at step " + std::to_string(step_ + 1) +
                "; lower --lr or raise --warmup-steps");
  }
  StepReport r;
  r.loss = result.loss;
  r.grad_norm = result.grad_norm;
  r.lr = lr;
  r.step = ++step_;
  r.steps = options_.steps;
  r.memory = &memory_;
  const GroupTraffic dp = strategy().meter().snapshot() - before[static_cast<std::size_t>(MeshAxis::kDp)];
  r.bytes_sent = dp.transport.bytes_sent;
  r.bytes_received = dp.transport.bytes_received;
  r.comm_wait_ms = ms(dp.blocked);
  r.theory = strategy().traffic_theory(A);
  r.groups = group_steps(before);
  if (mesh_) add_mesh_report(r);
  return r;
}

double Trainer::pipeline_loss_sum(const BatchSampler& sampler) {
  const int A = options_.grad_accum, T = sampler.T();
  const std::size_t N = static_cast<std::size_t>(B_) * T;
  const std::int64_t first = static_cast<std::int64_t>(mesh_->groups().coord.dp) * A * B_;
  const int group = pipeline_eval_group(options_);
  const int total = options_.eval_batches * A;  // micro-batches: A of each batch
  double sum = 0.0;
  std::vector<MicroBatch> micro_batches;
  for (int start = 0; start < total; start += group) {
    micro_batches.clear();
    for (int k = start; k < std::min(start + group, total); ++k) {
      const std::size_t at = static_cast<std::size_t>(k - start) * N;
      sampler.fill(k / A, first + static_cast<std::int64_t>(k % A) * B_, B_, inputs_.data() + at,
                   targets_.data() + at);
      micro_batches.push_back({inputs_.data() + at, targets_.data() + at, B_, T});
    }
    sum += mesh_->forward_loss_sum(micro_batches);
  }
  return sum;
}

// --eval-batches whole batches of --batch-size sequences, the same ones
// whatever the layout: each rank takes its part of each batch as a training
// step does (its data-parallel share, in --grad-accum micro-batches). It
// took one micro-batch of each, so that the loss of the same weights moved
// with --grad-accum (and so with a pipeline's --micro-batches).
double Trainer::evaluate(const BatchSampler& sampler) {
  strategy().begin_forward_only();
  const int N = strategy().world_size(), A = options_.grad_accum;
  double sum = 0.0;
  if (mesh_) {
    sum = pipeline_loss_sum(sampler);
  } else {
    const std::int64_t first = static_cast<std::int64_t>(strategy().rank()) * A * B_;
    for (int a = 0; a < A; ++a)
      sum += sampled_loss_sum(model(), *acts_, sampler, options_.eval_batches, first + static_cast<std::int64_t>(a) * B_);
  }
  strategy().sum_over_ranks({&sum, 1});
  return sum / (static_cast<double>(options_.eval_batches) * A * B_ * N * sampler.T());
}

fs::path Trainer::save_checkpoint() {
  // Paths absolute, so `--resume` works from any directory.
  nlohmann::json saved = run_options_json(options_);
  if (!options_.data.empty()) saved["data"] = fs::absolute(options_.data).string();
  const int dp = mesh_ ? mesh_->groups().shape.dp : strategy().world_size();
  const SavedLayout layout{std::string(strategy_name(strategy().kind())), dp, options_.tp, options_.pp};
  TrainState s{step_, saved, corpus_.source, corpus_.bytes.size(), corpus_.fingerprint(), layout, options_.run_id};
  // The settings that repeat this run (--config DIR/step_.../config.json),
  // published with the step.
  nlohmann::json config = config_json(options_);
  config.update(saved);
  config["strategy"] = layout.strategy;
  config["dp"] = layout.dp;
  const StepFiles extra{{"config.json", config.dump(2) + "\n"}};
  fs::path dir = mesh_ ? save_mesh_checkpoint(*mesh_, *world_, options_.checkpoint_dir, s, extra)
                 : strategy_->kind() == StrategyKind::kNone
                     ? trainer::save_checkpoint(options_.checkpoint_dir, model(), optimizer(), s, extra)
                     : save_sharded_checkpoint(*strategy_, options_.checkpoint_dir, s, extra);
  last_checkpoint_ = step_;
  return dir;
}

bool Trainer::checkpoint_due() const {
  return !options_.checkpoint_dir.empty() && last_checkpoint_ != step_ && options_.checkpoint_interval > 0 &&
         step_ % options_.checkpoint_interval == 0;
}

void Trainer::maybe_checkpoint(TrainObserver& observer, bool final_step) {
  if (options_.checkpoint_dir.empty() || last_checkpoint_ == step_) return;
  if (!checkpoint_due() && !final_step) return;
  observer.before_checkpoint(step_);
  fs::path dir;
  try {
    dir = save_checkpoint();
  } catch (const std::exception&) {
    // The error names the cause (a full disk, a peer that stopped); this
    // says what it cost: a timeout in a save read like one in training.
    spdlog::error("saving the checkpoint of step {} failed; {}", step_,
                  layout::after_failed_save(options_.checkpoint_dir, step_));
    throw;
  }
  observer.on_checkpoint(dir, step_);
}

MeshSummary Trainer::mesh_summary() {
  const MeshTotals& t = mesh_->totals();
  const double scheduled = (t.busy + t.idle).count();
  const double steps = static_cast<double>(std::max<std::int64_t>(totals_.steps, 1));
  MeshSummary m;
  m.shape = mesh_->groups().shape;
  m.schedule = pp_schedule_name(mesh_->schedule());
  m.micro_batches = options_.grad_accum;
  m.bubble = mesh_->gather_stages(scheduled > 0 ? t.idle.count() / scheduled : 0.0);
  m.bubble_theory = pp_bubble_theory(m.shape.pp, m.micro_batches);
  m.compute_ms_per_step =
      mesh_->gather_stages(t.busy.count() * 1e3 / static_cast<double>(std::max<std::int64_t>(t.timed_steps, 1)));
  m.peak_activation_bytes = mesh_->gather_stages(static_cast<double>(t.peak_activation_bytes));
  m.tp_comm_ms_per_step = mesh_->gather_stages(totals_.tp_wait_seconds * 1e3 / steps);
  m.pp_comm_ms_per_step = mesh_->gather_stages(totals_.pp_wait_seconds * 1e3 / steps);
  return m;
}

TrainSummary Trainer::run(TrainObserver& observer) {
  if (options_.eval_only) throw InvalidUsage("an --eval-only trainer does not train; call evaluate_windows()");
  TrainSummary sum;
  kernels::cpu::set_blas_threads(options_.threads);
  const bool training = step_ < options_.steps;  // alike on every rank
  PeakMeter peak(backend(parse_device(options_.device)), world_, options_.threads);
  if (training) peak.measure();
  std::optional<double> last_val;
  while (step_ < options_.steps) {
    const auto start = Clock::now();
    StepReport r = train_step();
    const double seconds = seconds_since(start);
    r.step_ms = seconds * 1e3;
    r.tokens_per_s = static_cast<double>(options_.tokens_per_step()) / seconds;
    sum.train_seconds += seconds;
    sum.tokens += options_.tokens_per_step();
    ++sum.steps_run;
    totals_.steps += 1;
    totals_.bytes_sent += static_cast<double>(r.bytes_sent);
    totals_.bytes_received += static_cast<double>(r.bytes_received);
    totals_.wait_seconds += r.comm_wait_ms * 1e-3;
    totals_.step_seconds += seconds;
    totals_.tp_wait_seconds += r.tp_comm_ms * 1e-3;
    totals_.pp_wait_seconds += r.pp_comm_ms * 1e-3;
    for (std::size_t g = 0; g < r.groups.size(); ++g) totals_.groups[g] += r.groups[g];
    const bool last = step_ == options_.steps;
    // A step's own loss is taken before its update, so only an evaluation
    // after it shows an update that broke the model: the last step's was
    // saved and reported with exit 0, and an interval checkpoint at a step
    // without an evaluation was published and moved `latest` onto it. Every
    // step that is saved is evaluated first. The loss is the same on every
    // rank (summed over them), so all stop alike.
    if (last || (options_.eval_interval > 0 && step_ % options_.eval_interval == 0) || checkpoint_due()) {
      r.val_loss = last_val = evaluate_val();
      if (!std::isfinite(*r.val_loss))
        throw Error("the validation loss became " + std::to_string(*r.val_loss) + " after step " +
                    std::to_string(step_) + " (no checkpoint of it is written); lower --lr or raise --warmup-steps");
    }
    observer.on_step(r);
    maybe_checkpoint(observer, last);
  }
  if (training) peak.measure();
  maybe_checkpoint(observer, true);
  sum.train_loss = evaluate_train();
  sum.val_loss = last_val ? *last_val : evaluate_val();
  // The whole model's parameters: under --tp / --pp this rank holds a part.
  const std::size_t params = ParamTable::gpt(options_.model, ModelLayout::whole(options_.model)).param_count();
  sum.flops_per_token = flops_per_token(options_.model, params);
  if (sum.train_seconds > 0) {
    sum.tokens_per_s = static_cast<double>(sum.tokens) / sum.train_seconds;
    sum.gflops = sum.flops_per_token * sum.tokens_per_s * 1e-9;
  }
  if (training) {
    const PeakFlops p = peak.result(sum.gflops);
    sum.peak_gflops = p.gflops;
    sum.peak_source = p.source;
    if (p.gflops > 0) sum.mfu = sum.gflops / p.gflops;
  }
  sum.memory = &memory_;
  sum.ranks = world_size();
  sum.comm = totals_;
  if (mesh_) sum.mesh = mesh_summary();
  return sum;
}

}  // namespace braid::trainer
