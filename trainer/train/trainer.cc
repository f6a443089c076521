#include "trainer/train/trainer.h"

#include <chrono>
#include <cmath>

#include <spdlog/spdlog.h>

#include "kernels/cpu/gpt_ops.h"
#include "runtime/errors.h"
#include "trainer/checkpoint/checkpoint.h"

namespace braid::trainer {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double flops_per_token(const GptConfig& c, std::size_t param_count) {
  const double multiplying = static_cast<double>(param_count) - static_cast<double>(c.block_size) * c.n_embd;
  return 6.0 * multiplying + 12.0 * c.n_layer * c.n_embd * static_cast<double>(c.block_size);
}

namespace {

const TrainOptions& checked(const TrainOptions& o, const TextCorpus& corpus) {
  validate(o);
  if (o.eval_only) {
    validate_data(o, corpus.bytes.size(), 0);
  } else {
    Split s = split(corpus);
    validate_data(o, s.train.size(), s.val.size());
  }
  return o;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

Trainer::Trainer(const TrainOptions& options, const TextCorpus& corpus)
    : options_(checked(options, corpus)),
      corpus_(corpus),
      model_(options.model, ModelLayout::whole(options.model), &memory_),
      optimizer_(model_.table(), Range{0, model_.table().count()},
                 AdamWConfig{0.9f, 0.95f, 1e-8f, options.weight_decay}, &memory_),
      acts_(model_.make_activations(options.micro_batch(), options.model.block_size)),
      schedule_{options.lr, options.min_lr, options.warmup_steps, options.steps} {
  const int T = options_.model.block_size;
  if (!options_.eval_only) {
    Split s = split(corpus_);
    train_.emplace(s.train, T, options_.seed, SampleStream::kTrain);
    train_eval_.emplace(s.train, T, options_.seed, SampleStream::kTrainEval);
    val_.emplace(s.val, T, options_.seed, SampleStream::kVal);
  }
  inputs_.resize(static_cast<std::size_t>(options_.micro_batch()) * T);
  targets_.resize(inputs_.size());
}

void Trainer::start() {
  if (!options_.resume.empty()) {
    const fs::path dir = resolve_checkpoint(options_.resume);
    TrainState s = load_checkpoint(dir, model_, optimizer_);
    step_ = last_checkpoint_ = s.step;
    if (s.data_bytes != corpus_.bytes.size() || s.data_fingerprint != corpus_.fingerprint()) {
      spdlog::warn("the data ({}) differs from the data this checkpoint was trained on ({}); "
                   "the resumed run will not reproduce the original", corpus_.source, s.data_source);
    }
    spdlog::info("resumed from {} at step {}", dir.string(), step_);
  } else if (!options_.init_from.empty()) {
    load_weights(options_.init_from, model_);
    spdlog::info("initial weights from {}", options_.init_from);
  } else {
    model_.init(options_.seed);
  }
  if (!options_.init_out.empty()) {
    save_weights(options_.init_out, model_, step_);
    spdlog::info("wrote the initial weights to {}", options_.init_out);
  }
}

StepReport Trainer::train_step() {
  const int B = options_.micro_batch(), T = options_.model.block_size;
  // Every target of the global batch weighs the same in the mean loss.
  const auto dloss = static_cast<float>(1.0 / (static_cast<double>(options_.batch_size) * T));
  model_.zero_grads();
  double loss = 0.0;
  for (int a = 0; a < options_.grad_accum; ++a) {
    train_->fill(step_, static_cast<std::int64_t>(a) * B, B, inputs_.data(), targets_.data());
    acts_.set_shape(B, T);
    loss += model_.forward(acts_, inputs_.data(), targets_.data());
    model_.backward(acts_, dloss);
  }
  loss /= options_.grad_accum;
  if (!std::isfinite(loss)) {
    throw Error("the loss became " + std::to_string(loss) + " at step " + std::to_string(step_ + 1) +
                "; lower --lr or raise --warmup-steps");
  }
  StepReport r;
  r.loss = loss;
  r.grad_norm = std::sqrt(grad_square_sum(model_.grads().span()));
  clip_grads(model_.grads().span(), r.grad_norm, options_.grad_clip);
  r.lr = schedule_.at(step_);
  optimizer_.update(model_.params().span(), model_.grads().span(), r.lr, static_cast<long>(step_ + 1));
  r.step = ++step_;
  r.steps = options_.steps;
  r.memory = &memory_;
  return r;
}

fs::path Trainer::save_checkpoint() {
  // Paths absolute, so `--resume` works from any directory.
  nlohmann::json saved = run_options_json(options_);
  if (!options_.data.empty()) saved["data"] = fs::absolute(options_.data).string();
  saved["checkpoint_dir"] = fs::absolute(options_.checkpoint_dir).string();
  TrainState s{step_, saved, corpus_.source, corpus_.bytes.size(), corpus_.fingerprint()};
  fs::path dir = trainer::save_checkpoint(options_.checkpoint_dir, model_, optimizer_, s);
  last_checkpoint_ = step_;
  return dir;
}

void Trainer::maybe_checkpoint(TrainObserver& observer, bool final_step) {
  if (options_.checkpoint_dir.empty() || last_checkpoint_ == step_) return;
  const bool due = options_.checkpoint_interval > 0 && step_ % options_.checkpoint_interval == 0;
  if (due || final_step) observer.on_checkpoint(save_checkpoint(), step_);
}

TrainSummary Trainer::run(TrainObserver& observer) {
  if (options_.eval_only) throw InvalidUsage("an --eval-only trainer does not train; call evaluate_windows()");
  TrainSummary sum;
  kernels::cpu::set_blas_threads(options_.threads);
  if (step_ < options_.steps) sum.peak_gflops = kernels::cpu::measure_sgemm_gflops() * options_.threads;
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
    const bool last = step_ == options_.steps;
    if (last || (options_.eval_interval > 0 && step_ % options_.eval_interval == 0)) {
      r.val_loss = last_val = evaluate_val();
    }
    observer.on_step(r);
    maybe_checkpoint(observer, last);
  }
  maybe_checkpoint(observer, true);
  sum.train_loss = evaluate_train();
  sum.val_loss = last_val ? *last_val : evaluate_val();
  sum.flops_per_token = flops_per_token(options_.model, model_.table().count());
  if (sum.train_seconds > 0) {
    sum.tokens_per_s = static_cast<double>(sum.tokens) / sum.train_seconds;
    sum.gflops = sum.flops_per_token * sum.tokens_per_s * 1e-9;
  }
  if (sum.peak_gflops > 0) sum.mfu = sum.gflops / sum.peak_gflops;
  sum.memory = &memory_;
  return sum;
}

}  // namespace braid::trainer
