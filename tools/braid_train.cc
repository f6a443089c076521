// braid-train: trains a byte-level GPT on one process (issue 4).
// A thin main: CLI11 parsing and printing; the machinery is in trainer/.
//
// Exit status: 0 done, 2 invalid usage (bad flags, a bad combination, a
// missing or refused file), 1 any other failure.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <set>
#include <string>

#include <CLI/CLI.hpp>

#include "runtime/errors.h"
#include "runtime/log.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/train/generate.h"
#include "trainer/train/report.h"
#include "trainer/train/trainer.h"

namespace {

using braid::trainer::TrainOptions;

void add_model_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--n-layer", o.model.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--n-head", o.model.n_head, "attention heads (must divide n_embd)")->capture_default_str();
  app.add_option("--n-embd", o.model.n_embd, "channels")->capture_default_str();
  app.add_option("--block-size", o.model.block_size, "sequence length T")->capture_default_str();
}

void add_run_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--batch-size", o.batch_size, "GLOBAL batch, in sequences")->capture_default_str();
  app.add_option("--grad-accum", o.grad_accum, "micro-batches per step (divides batch-size)")->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
  app.add_option("--lr", o.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", o.min_lr, "learning rate at the end of the cosine decay")->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "linear warmup steps")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (2-D weights)")->capture_default_str();
  app.add_option("--grad-clip", o.grad_clip, "max global gradient norm (0: off)")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the init, the batches and the sampling")->capture_default_str();
  app.add_option("--data", o.data, "text file (default: the fortunes in /usr/share/games/fortunes)");
  app.add_option("--eval-interval", o.eval_interval, "steps between val evaluations (0: at the end)")->capture_default_str();
  app.add_option("--eval-batches", o.eval_batches, "micro-batches per evaluation")->capture_default_str();
  app.add_option("--checkpoint-interval", o.checkpoint_interval, "steps between checkpoints (0: at the end)")
      ->capture_default_str();
}

void add_invocation_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "write checkpoints here");
  app.add_option("--resume", o.resume, "continue from a checkpoint directory (saved options are the defaults)");
  app.add_option("--init-from", o.init_from, "start from these safetensors weights (their sizes are the defaults)");
  app.add_option("--init-out", o.init_out, "write the initial weights to this safetensors file");
  app.add_option("--metrics", o.metrics, "write one JSON object per step to this file");
  app.add_flag("--eval-only", o.eval_only, "print the mean loss of the weights over --data's windows and exit");
  app.add_option("--sample", o.sample_bytes, "generate this many bytes at the end")->capture_default_str();
  app.add_option("--temperature", o.temperature, "sampling temperature (0: greedy)")->capture_default_str();
  app.add_option("--prompt", o.prompt, "text the sample continues");
  app.add_option("--threads", o.threads, "BLAS threads")->capture_default_str();
}

// Keys ("n_layer") of the flags given on the command line: they win over
// the values saved in a checkpoint.
std::set<std::string> explicit_keys(const CLI::App& app) {
  std::set<std::string> keys;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() == 0) continue;
    std::string key = opt->get_name();
    key.erase(0, key.find_first_not_of('-'));
    std::replace(key.begin(), key.end(), '-', '_');
    keys.insert(key);
  }
  return keys;
}

void apply_saved_options(const std::set<std::string>& given, TrainOptions& o) {
  namespace t = braid::trainer;
  if (!o.resume.empty() && !o.init_from.empty()) {
    throw braid::InvalidUsage("--resume and --init-from exclude each other; pass one");
  }
  if (!o.resume.empty()) {
    t::apply_run_options(t::read_train_state(t::resolve_checkpoint(o.resume)).options, given, o);
  } else if (!o.init_from.empty()) {
    const braid::trainer::GptConfig c = t::read_weights_config(o.init_from);
    nlohmann::json saved = {{"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_embd", c.n_embd},
                            {"block_size", c.block_size}};
    t::apply_run_options(saved, given, o);
  }
}

int run(const TrainOptions& o) {
  namespace t = braid::trainer;
  t::validate(o);
  const t::TextCorpus corpus = o.data.empty() ? t::load_default_corpus() : t::load_text_file(o.data);
  t::Trainer trainer(o, corpus);
  trainer.start();
  if (o.eval_only) {
    const t::WindowLoss r = trainer.evaluate_windows();
    std::printf("eval_loss: %.9g (%lld windows of %d bytes, %lld target bytes of %s)\n", r.loss,
                static_cast<long long>(r.windows), o.model.block_size, static_cast<long long>(r.tokens),
                corpus.source.c_str());
    return 0;
  }
  std::fprintf(stderr, "braid-train: model %s (%zu parameters), %zu bytes of data from %s\n",
               t::describe(o.model).c_str(), trainer.model().table().count(), corpus.bytes.size(),
               corpus.source.c_str());
  t::ProgressPrinter progress(::isatty(STDERR_FILENO) != 0);
  t::Observers observers;
  observers.add(&progress);
  std::optional<t::MetricsWriter> metrics;
  if (!o.metrics.empty()) observers.add(&metrics.emplace(o.metrics));
  const t::TrainSummary summary = trainer.run(observers);
  std::fputs(t::format_summary(summary, o).c_str(), stdout);
  if (o.sample_bytes > 0) {
    const std::string text = t::generate(trainer.model(), o.prompt, o.sample_bytes, o.temperature, o.seed);
    std::printf("--- sample (%d bytes, temperature %g) ---\n%s%s\n", o.sample_bytes, o.temperature,
                o.prompt.c_str(), text.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  braid::runtime::setup_logging(0);
  TrainOptions options;
  CLI::App app{"braid-train: trains a byte-level GPT (GPT-2 shape) on one process"};
  add_model_flags(app, options);
  add_run_flags(app, options);
  add_invocation_flags(app, options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    apply_saved_options(explicit_keys(app), options);
    return run(options);
  } catch (const braid::InvalidUsage& e) {
    std::fprintf(stderr, "braid-train: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-train: failed: %s\n", e.what());
    return 1;
  }
}
