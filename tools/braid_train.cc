// braid-train: trains a byte-level GPT on one process (issue 4) or, under
// braid-launch (or torchrun, Slurm, mpirun), data-parallel on every rank
// with --strategy dp|ddp|zero1|zero2|zero3 (issue 5; default ddp on more
// than one rank), and over a DP x TP x PP mesh with --dp D --tp T --pp P
// [--micro-batches M --schedule gpipe|1f1b] (issue 6; DP ddp or zero1). A
// thin main: CLI11 parsing and printing; the machinery is
// in trainer/. Rank 0 prints; every rank writes its own --metrics file.
//
// --consolidate DIR --out FILE writes the weights of a checkpoint of any
// layout (one process, sharded by any strategy and world size, or a mesh
// run's, which writes every stage's tensors whole) as one
// safetensors file that --init-from loads, and exits.
//
// nanoGPT's spellings are aliases where braid-train has the same setting:
// --n_layer --n_head --n_embd --block_size --batch_size (braid's is the
// GLOBAL batch) --learning_rate --max_iters --min_lr --warmup_iters
// --weight_decay --grad_clip --eval_interval --eval_iters --out_dir
// --log_interval. nanoGPT's gradient_accumulation_steps (divided by the
// world size) and init_from ('scratch' | 'resume') mean other things and are
// not taken. --config FILE reads the JSON a checkpoint's config.json holds.
//
// Exit status: 0 done, 2 invalid usage (bad flags, a bad combination, a
// missing or refused file), 1 any other failure.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <filesystem>

#include "comm/communicator.h"
#include "kernels/cpu/gpt_ops.h"
#include "runtime/errors.h"
#include "runtime/log.h"
#include "runtime/rank_info.h"
#include "trainer/checkpoint/atomic_file.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/layout.h"
#include "trainer/checkpoint/sharded.h"
#include "trainer/strategy/compose.h"
#include "trainer/train/generate.h"
#include "trainer/train/memory_plan.h"
#include "trainer/train/report.h"
#include "trainer/train/resume.h"
#include "trainer/train/trainer.h"
#include "tools/decimal_flag.h"

namespace {

using braid::trainer::TrainOptions;

using braid::tools::decimal;

void add_model_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--n-layer,--n_layer", o.model.n_layer, "transformer blocks")
      ->transform(decimal(o.model.n_layer))->capture_default_str();
  app.add_option("--n-head,--n_head", o.model.n_head, "attention heads (must divide n_embd)")
      ->transform(decimal(o.model.n_head))->capture_default_str();
  app.add_option("--n-embd,--n_embd", o.model.n_embd, "channels")
      ->transform(decimal(o.model.n_embd))->capture_default_str();
  app.add_option("--block-size,--block_size", o.model.block_size, "sequence length T")
      ->transform(decimal(o.model.block_size))->capture_default_str();
}

void add_run_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--batch-size,--batch_size", o.batch_size, "GLOBAL batch, in sequences")
      ->transform(decimal(o.batch_size))->capture_default_str();
  app.add_option("--grad-accum,--micro-batches", o.grad_accum,
                 "micro-batches per step and DP rank (M of a pipeline schedule; divides batch-size / dp)")
      ->transform(decimal(o.grad_accum))
      ->capture_default_str();
  app.add_option("--steps,--max_iters", o.steps, "optimizer steps")
      ->transform(decimal(o.steps))->capture_default_str();
  app.add_option("--lr,--learning_rate", o.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr,--min_lr", o.min_lr, "learning rate at the end of the cosine decay")->capture_default_str();
  app.add_option("--warmup-steps,--warmup_iters", o.warmup_steps, "linear warmup steps")
      ->transform(decimal(o.warmup_steps))->capture_default_str();
  app.add_option("--weight-decay,--weight_decay", o.weight_decay, "AdamW decoupled weight decay (2-D weights)")->capture_default_str();
  app.add_option("--grad-clip,--grad_clip", o.grad_clip, "max global gradient norm (0: off)")->capture_default_str();
  // CLI11 read "-1" into the unsigned seed as 2^64 - 1, without a word.
  app.add_option("--seed", o.seed, "seed of the init, the batches and the sampling")
      ->transform(decimal(o.seed))
      ->capture_default_str();
  app.add_option("--data", o.data, "text file (default: the fortunes in /usr/share/games/fortunes)");
  app.add_option("--eval-interval,--eval_interval", o.eval_interval, "steps between val evaluations (0: at the end)")
      ->transform(decimal(o.eval_interval))->capture_default_str();
  app.add_option("--eval-batches,--eval_iters", o.eval_batches, "batches per evaluation, each of --batch-size sequences (the same ones on any layout)")
      ->transform(decimal(o.eval_batches))->capture_default_str();
  app.add_option("--checkpoint-interval", o.checkpoint_interval, "steps between checkpoints (0: at the end)")
      ->transform(decimal(o.checkpoint_interval))
      ->capture_default_str();
}

void add_invocation_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--checkpoint-dir,--out-dir,--out_dir", o.checkpoint_dir, "write checkpoints here");
  app.add_option("--resume", o.resume, "continue from a checkpoint directory (saved options are the defaults)");
  app.add_option("--init-from", o.init_from, "start from these safetensors weights or a checkpoint directory's latest step (their sizes are the defaults)");
  app.add_option("--init-out", o.init_out, "write the initial weights to this safetensors file");
  app.add_option("--metrics", o.metrics, "write one JSON object per step to this file");
  app.add_option("--log-interval,--log_interval", o.log_interval,
                 "print a line every N steps (0: about 20 lines, a progress bar on a terminal)")
                     ->transform(decimal(o.log_interval))
      ->capture_default_str();
  app.add_option("--config", o.config,
                 "JSON file of settings (as a checkpoint's config.json); flags given here override it");
  app.add_flag("--eval-only", o.eval_only, "print the mean loss of the weights over --data's windows and exit");
  app.add_option("--sample", o.sample_bytes, "generate this many bytes at the end")
      ->transform(decimal(o.sample_bytes))->capture_default_str();
  app.add_option("--temperature", o.temperature, "sampling temperature (0: greedy)")->capture_default_str();
  app.add_option("--prompt", o.prompt, "text the sample continues");
  app.add_option("--threads", o.threads, "BLAS threads per rank")
      ->transform(decimal(o.threads))->capture_default_str();
  app.add_option("--device", o.device, "cpu or cuda (rank r uses GPU local_rank % GPUs)")->capture_default_str();
  app.add_option("--strategy", o.strategy,
                 "data parallelism: none, dp, ddp, zero1, zero2, zero3 (default: none on one rank, ddp on more)");
  app.add_option("--bucket-mb", o.bucket_mb, "gradient bucket size in MiB (ddp, zero1, zero2)")->capture_default_str();
  app.add_option("--dp", o.dp, "data-parallel ranks (default: world / (tp x pp))")
      ->transform(decimal(o.dp))->capture_default_str();
  app.add_option("--tp", o.tp, "tensor-parallel ranks (divide n_head)")
      ->transform(decimal(o.tp))->capture_default_str();
  app.add_option("--pp", o.pp, "pipeline stages (at most n_layer)")->transform(decimal(o.pp))->capture_default_str();
  app.add_option("--schedule", o.schedule, "pipeline schedule: gpipe or 1f1b")->capture_default_str();
  app.add_option("--consolidate", o.consolidate, "write this checkpoint's weights to --out as one file and exit");
  app.add_option("--out", o.out, "the consolidated safetensors file");
}

// Keys ("n_layer") of the flags given on the command line: they win over
// the values saved in a checkpoint.
std::set<std::string> explicit_keys(const CLI::App& app) {
  std::set<std::string> keys;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() == 0) continue;
    std::string key = opt->get_name();  // the first long name: "--n-layer" for --n_layer too
    key.erase(0, key.find_first_not_of('-'));
    std::replace(key.begin(), key.end(), '-', '_');
    keys.insert(key);
  }
  return keys;
}

// The defaults a --resume checkpoint or --init-from file sets; rank 0
// prints what a resume restores.
void apply_saved_options(const std::set<std::string>& given_flags, const braid::runtime::RankInfo& info, TrainOptions& o) {
  namespace t = braid::trainer;
  if (!o.resume.empty() && !o.init_from.empty()) {
    throw braid::InvalidUsage("--resume and --init-from exclude each other; pass one");
  }
  // `--data $CORPUS` with CORPUS unset trained on the default corpus.
  if (given_flags.count("data") != 0 && o.data.empty())
    throw braid::InvalidUsage("--data is empty (an unset shell variable?); leave it out for the default corpus");
  // `--strategy $STRATEGY` with STRATEGY unset trained with the default.
  if (given_flags.count("strategy") != 0 && o.strategy.empty())
    throw braid::InvalidUsage("--strategy is empty (an unset shell variable?); leave it out for the default, or "
                              "choose one of none, dp, ddp, zero1, zero2, zero3");
  // A --config file's settings count as given: a checkpoint's saved values
  // do not override them.
  std::set<std::string> given = given_flags;
  if (!o.config.empty()) given.merge(t::apply_config_file(o.config, given_flags, o));
  o.run_id = info.run_id;
  // Restarted by the launcher (--max-restarts): go on from the job's own
  // last checkpoint, as torchrun users expect, rather than from scratch or
  // from the --resume checkpoint the first attempt started from.
  if (info.restart_count > 0) {
    if (const t::RestartPoint own = t::restart_checkpoint(o, info.run_id); !own.path.empty()) {
      o.resume = own.path;
      o.init_from.clear();
      if (info.rank == 0 && !own.passed_over.empty())
        std::fprintf(stderr, "restart %d: passing over what the checkpoint directory's 'latest' names: %s\n",
                     info.restart_count, own.passed_over.c_str());
      if (info.rank == 0)
        std::fprintf(stderr, "restart %d: resuming from the last checkpoint in %s\n", info.restart_count,
                     own.path.c_str());
    }
  }
  if (!o.resume.empty()) {
    const std::string note = t::apply_resume(given, info.world_size, o);
    if (info.rank == 0) std::fputs(note.c_str(), stderr);
    // "check --data" named a flag the user never gave.
    std::error_code ec;
    if (given.count("data") == 0 && !o.data.empty() && !std::filesystem::exists(o.data, ec))
      throw braid::InvalidUsage("the corpus " + o.data + " that the checkpoint " + o.resume +
                                " recorded does not exist (moved or removed?); pass --data FILE with the same "
                                "contents to read it from elsewhere");
  } else if (!o.init_from.empty()) {
    // A weights file, or a checkpoint directory (its latest step).
    const braid::trainer::GptConfig c =
        std::filesystem::is_directory(o.init_from)
            ? t::CheckpointReader::open(t::resolve_checkpoint(o.init_from)).config()
            : t::read_weights_config(o.init_from);
    nlohmann::json saved = {{"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_embd", c.n_embd},
                            {"block_size", c.block_size}};
    t::apply_run_options(saved, given, o);
  }
  // config.json records the interval but not the directory (a repeat of
  // the run must not write into the run's own): the bare "needs
  // --checkpoint-dir" named a flag the user never gave.
  // A --lr below the end of the decay that the user did not set (the
  // default 3e-4, or a resumed run's): the decay ends at a tenth of it, as
  // the defaults do (3e-3, 3e-4). It was refused over --min-lr, a flag the
  // user never gave.
  if (given.count("lr") != 0 && given.count("min_lr") == 0 && o.min_lr > o.lr) {
    if (info.rank == 0)
      std::fprintf(stderr, "--lr %g is below the end of the decay (--min-lr %g, not given): the decay ends at %g\n",
                   static_cast<double>(o.lr), static_cast<double>(o.min_lr), static_cast<double>(o.lr / 10));
    o.min_lr = o.lr / 10;
  }
  // "or leave --dp out" named a flag the user never gave, and "--tp 2 x
  // --pp 1 is not the world" named flags that config.json had set.
  std::string from_config;
  for (const char* axis : {"dp", "tp", "pp"})
    if (given.count(axis) != 0 && given_flags.count(axis) == 0)
      from_config += std::string(from_config.empty() ? "" : ", ") + axis + " " +
                     std::to_string(*axis == 'd' ? o.dp : *axis == 't' ? o.tp : o.pp);
  const std::int64_t dp = o.tp > 0 && o.pp > 0 && o.dp >= 0 ? std::max(o.dp_size(info.world_size), 1) : 0;
  const std::int64_t layout = dp * o.tp * o.pp;
  if (!from_config.empty() && dp > 0 && !o.eval_only && o.consolidate.empty() && layout != info.world_size)
    throw braid::InvalidUsage("--config " + o.config + " sets " + from_config + ", and dp " + std::to_string(dp) +
                              " x tp " + std::to_string(o.tp) +
                              " x pp " + std::to_string(o.pp) + " is not the world of " +
                              std::to_string(info.world_size) + " rank(s): pass --dp / --tp / --pp for this world" +
                              (o.dp > 0 && given_flags.count("dp") == 0 ? " (--dp 0: world / (tp x pp))" : "") +
                              ", or start " + std::to_string(layout) + " ranks");
  // --eval-only and --consolidate save nothing: a step's config.json saved
  // at intervals had no command line they took (a review helper's case).
  if (given.count("checkpoint_interval") != 0 && given_flags.count("checkpoint_interval") == 0 &&
      (o.eval_only || !o.consolidate.empty()))
    o.checkpoint_interval = 0;
  if (given.count("checkpoint_interval") != 0 && given_flags.count("checkpoint_interval") == 0 &&
      o.checkpoint_interval > 0 && o.checkpoint_dir.empty())
    throw braid::InvalidUsage("--config " + o.config + " sets checkpoint_interval " +
                              std::to_string(o.checkpoint_interval) +
                              ", which needs a directory: pass a new --checkpoint-dir beside it (config.json does not "
                              "record the run's own), or --checkpoint-interval 0");
}

// Holds the run's --checkpoint-dir (rank 0; DirectoryLock) and, under that
// hold, refuses a directory holding another run's checkpoints (a `latest`),
// on every rank: a fresh run would replace that run's steps of the same
// numbers and prune the others, and so would a run resumed from elsewhere
// (it wrote into the other run's directory without a word). Checked under
// the hold, so that two fresh runs started together cannot both find the
// directory empty.
std::unique_ptr<braid::trainer::DirectoryLock> guard_checkpoint_dir(const braid::runtime::RankInfo& info,
                                                                    const TrainOptions& o) {
  namespace fs = std::filesystem;
  if (o.checkpoint_dir.empty() || o.eval_only || !o.consolidate.empty()) return nullptr;
  // One in another run's step directory was taken (its lock file and
  // steps written there), and that run's next prune removed it with every
  // step, without a word (found by a review helper).
  if (const auto step = braid::trainer::layout::enclosing_step(o.checkpoint_dir))
    throw braid::InvalidUsage("--checkpoint-dir " + o.checkpoint_dir + " lies in the checkpoint step directory " +
                              step->string() + ", which that run replaces or prunes with whatever is in it; "
                              "name a directory outside it");
  std::unique_ptr<braid::trainer::DirectoryLock> lock;
  if (info.rank == 0) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    lock = braid::trainer::DirectoryLock::take(
        o.checkpoint_dir, "braid-train pid " + std::to_string(::getpid()) + " on " + host +
                              (o.run_id.empty() ? std::string() : ", run " + o.run_id));
  }
  const fs::path dir = o.checkpoint_dir;
  if (!fs::exists(dir / "latest")) {
    // A first save that published its step but could not write `latest`
    // (a full disk) left a whole step a fresh run would replace.
    const auto step = braid::trainer::layout::newest_complete_step(dir);
    if (!step) return lock;
    if (o.resume.empty())
      throw braid::InvalidUsage("--checkpoint-dir " + o.checkpoint_dir + " holds the complete step " +
                                step->filename().string() + " of an earlier run, though no 'latest' names it (a " +
                                "save that failed before naming its step?): continue that run with --resume " +
                                step->string() + ", or pass another --checkpoint-dir (or remove that one)");
  } else if (o.resume.empty()) {
    throw braid::InvalidUsage("--checkpoint-dir " + o.checkpoint_dir +
                              " holds the checkpoints of an earlier run: continue it with --resume " +
                              o.checkpoint_dir + ", or pass another --checkpoint-dir (or remove that one)");
  }
  const fs::path resumed = braid::trainer::checkpoint_home(braid::trainer::resolve_checkpoint(o.resume));
  std::error_code ec;
  if (!fs::equivalent(resumed, dir, ec))
    throw braid::InvalidUsage("--checkpoint-dir " + o.checkpoint_dir + " holds the checkpoints of another run than " +
                              o.resume + ", which this run resumes: writing there would replace that run's steps "
                              "of the same numbers and prune the others; pass another --checkpoint-dir (or leave it "
                              "out to go on writing into " + resumed.string() +
                              ")");
  return lock;
}

// The communicator of a data-parallel run: one under a launcher with more
// than one rank, or when a data-parallel strategy is asked for explicitly.
std::unique_ptr<braid::comm::Communicator> connect(const TrainOptions& o, const braid::runtime::RankInfo& info) {
  const bool parallel = info.world_size > 1 || (!o.strategy.empty() && o.strategy != "none");
  if (!parallel) return nullptr;
  // "start it without braid-launch" was said to a run started without it.
  if (o.eval_only)
    throw braid::InvalidUsage(info.world_size > 1 ? "--eval-only runs on one process; start it without braid-launch"
                                                  : "--eval-only runs on one process, without a strategy, and this "
                                                    "run has strategy " + o.strategy +
                                                        ": leave --strategy out (or pass --strategy none)");
  braid::runtime::setup_logging(info.rank);
  return braid::comm::Communicator::create_world(info);
}

int consolidate(const TrainOptions& o) {
  const std::int64_t step = braid::trainer::consolidate_checkpoint(o.consolidate, o.out);
  std::printf("wrote the weights of step %lld of %s to %s\n", static_cast<long long>(step), o.consolidate.c_str(),
              o.out.c_str());
  return 0;
}

// --sample N: every rank generates (ZeRO-3 gathers the units
// collectively); rank 0 prints.
void print_sample(braid::trainer::Trainer& trainer, const TrainOptions& o) {
  if (o.sample_bytes <= 0) return;
  trainer.strategy().begin_forward_only();
  const std::string text = braid::trainer::generate(trainer.model(), o.prompt, o.sample_bytes, o.temperature, o.seed);
  if (trainer.rank() == 0) {
    std::printf("--- sample (%d bytes, temperature %g) ---\n%s%s\n", o.sample_bytes, o.temperature, o.prompt.c_str(),
                braid::trainer::terminal_safe(text).c_str());
  }
}

int eval_only(braid::trainer::Trainer& trainer, const braid::trainer::TextCorpus& corpus, const TrainOptions& o) {
  const braid::trainer::WindowLoss r = trainer.evaluate_windows();
  std::printf("eval_loss: %.9g (%lld windows of %d bytes, %lld target bytes of %s)\n", r.loss,
              static_cast<long long>(r.windows), o.model.block_size, static_cast<long long>(r.tokens),
              corpus.source.c_str());
  print_sample(trainer, o);  // the weights' text too, as nanoGPT's sample.py (it was left out without a word)
  return 0;
}

// Flags given that the run would ignore, without a word (found by a review
// helper): they are refused, saying what they need.
void refuse_ignored(const std::set<std::string>& given, const TrainOptions& o, int world_size) {
  if (o.sample_bytes == 0)
    for (const char* flag : {"prompt", "temperature"})
      if (given.count(flag) != 0)
        throw braid::InvalidUsage(std::string("--") + flag + " shapes the text of --sample N, which is not given; "
                                  "add --sample N (bytes to generate)");
  if (o.eval_only && !o.metrics.empty())
    throw braid::InvalidUsage("--metrics records training steps, and --eval-only trains none; leave it out (the "
                              "loss is printed)");
  if (o.pp == 1 && given.count("schedule") != 0)
    throw braid::InvalidUsage("--schedule orders a pipeline's micro-batches; it needs --pp 2 or more");
  // One process, --strategy dp or zero3, or one DP rank beside --tp / --pp
  // has no gradient buckets: the value was taken, recorded, and ignored.
  if (given.count("bucket_mb") != 0 && !o.eval_only && o.consolidate.empty() && o.tp > 0 && o.pp > 0) {
    const int dp = o.dp_size(world_size);
    const std::string strategy = braid::trainer::strategy_or_default(o.strategy, dp);
    if (dp <= 1 || (strategy != "ddp" && strategy != "zero1" && strategy != "zero2"))
      throw braid::InvalidUsage("--bucket-mb sizes the gradient buckets of ddp, zero1 and zero2 on 2 or more DP "
                                "ranks, and this run has " +
                                (dp <= 1 ? std::string("one DP rank") : "strategy " + strategy) + "; leave it out");
  }
}

// Outputs and modes that --consolidate (it writes --out and exits) and
// --eval-only (it prints a loss) never reach: they ran and exited 0 with no
// metrics, no sample and no checkpoint written (found by a review helper).
// Both modes are the command line's alone, so this runs before a
// checkpoint or weights file is read.
void refuse_unused(const std::set<std::string>& given, const TrainOptions& o) {
  auto refuse = [&](const std::string& mode, const std::vector<std::string>& flags, const std::string& why) {
    for (const std::string& flag : flags) {
      // --checkpoint-interval 0 is the documented way past a config.json
      // saved at intervals: it asks for nothing.
      if (given.count(flag) == 0 || (flag == "checkpoint_interval" && o.checkpoint_interval == 0)) continue;
      std::string name = "--" + flag;
      std::replace(name.begin(), name.end(), '_', '-');
      if (name == "--checkpoint-dir") name += " (--out-dir)";  // nanoGPT's spelling
      throw braid::InvalidUsage(name + " is not used by " + mode + ", which " + why + "; leave it out");
    }
  };
  if (!o.consolidate.empty()) {
    // And every other flag but --out (and a --config file, whose settings
    // are a file's): the checkpoint sets the model and nothing trains, so
    // --n-layer 3, --init-from B or --steps 9 were taken and ignored.
    std::vector<std::string> flags = {"metrics", "sample", "prompt", "temperature", "eval_only", "init_out",
                                      "checkpoint_dir", "checkpoint_interval"};
    for (const std::string& flag : given)
      if (flag != "consolidate" && flag != "out" && flag != "config") flags.push_back(flag);
    refuse("--consolidate", flags, "writes the checkpoint's weights to --out and exits");
  }
  // The model's flags (checked against the weights), --data, --batch-size
  // and --grad-accum (the windows evaluated at once), --seed, --sample and
  // --device count; the optimizer's and the schedule's did not.
  if (o.eval_only)
    refuse("--eval-only",
           {"checkpoint_dir", "checkpoint_interval", "steps", "lr", "min_lr", "warmup_steps", "weight_decay",
            "grad_clip", "eval_interval", "eval_batches", "bucket_mb", "log_interval"},
           "trains no step and saves nothing (it evaluates every window of --data once)");
}

// This rank's node in the rank map: from the hosts the ranks run on, not
// from the launcher (Open MPI's OMPI_COMM_WORLD_NODE_RANK is a rank within
// the node, not a node index).
int node_index(braid::trainer::Trainer& trainer, const braid::runtime::RankInfo& info) {
  return trainer.world() != nullptr ? trainer.world()->host_index(trainer.rank()) : info.node_rank;
}

// "7760 parameters in total; each rank holds 3968 (its TP / PP part)": the
// model's count is the whole model's, whatever the layout.
std::string describe_params(braid::trainer::Trainer& trainer, const std::vector<braid::trainer::RankStats>& ranks) {
  namespace t = braid::trainer;
  const TrainOptions& o = trainer.options();
  const double total = t::ParamTable::gpt_param_count(o.model, t::ModelLayout::whole(o.model));
  std::string text = std::to_string(static_cast<long long>(total)) + " parameters in total";
  if (trainer.mesh() == nullptr) return text;
  const auto [low, high] = std::minmax_element(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) {
    return a.params < b.params;
  });
  text += "; each rank holds its TP / PP part: ";
  text += low->params == high->params ? std::to_string(static_cast<long long>(low->params))
                                      : std::to_string(static_cast<long long>(low->params)) + " to " +
                                            std::to_string(static_cast<long long>(high->params)) + " (rank map)";
  return text;
}

// "strategy ddp: ..." on a DP run; the mesh and its DP axis under --tp / --pp
// (whose DP strategy may be "none" while TP and PP communicate).
std::string describe_layout(braid::trainer::Trainer& trainer) {
  braid::trainer::Strategy& strategy = trainer.strategy();
  if (trainer.mesh() == nullptr) return "strategy " + strategy.describe();
  const braid::trainer::MeshShape& m = trainer.mesh()->groups().shape;
  return "mesh dp " + std::to_string(m.dp) + " x tp " + std::to_string(m.tp) + " x pp " + std::to_string(m.pp) +
         "; DP axis: " + std::string(braid::trainer::strategy_name(strategy.kind())) +
         (m.dp == 1 ? " (one DP rank: no DP communication; TP and PP communicate)" : "");
}

// The rank map and every rank's memory (collective; rank 0 prints).
void print_start(braid::trainer::Trainer& trainer, const braid::runtime::RankInfo& info,
                 const braid::trainer::TextCorpus& corpus) {
  namespace t = braid::trainer;
  t::Strategy& strategy = trainer.strategy();
  const auto ranks = t::gather_rank_stats(trainer, t::rank_stats(trainer, info.local_rank, node_index(trainer, info)));
  if (trainer.rank() != 0) return;
  const TrainOptions& o = trainer.options();
  std::fprintf(stderr, "braid-train: model %s (%s), %zu bytes of data from %s; device %s\n",
               t::describe(o.model).c_str(), describe_params(trainer, ranks).c_str(), corpus.bytes.size(),
               corpus.source.c_str(), trainer.model().ops().describe().c_str());
  std::fprintf(stderr, "braid-train: %d rank(s), %s; global batch %d = %d DP rank(s) x %d micro-batch(es) x %d\n",
               trainer.world_size(), describe_layout(trainer).c_str(), o.batch_size, strategy.world_size(),
               o.grad_accum, o.rank_micro_batch(strategy.world_size()));
  if (trainer.mesh() != nullptr) {
    std::fprintf(stderr, "braid-train: schedule %s\n%s", o.schedule.c_str(),
                 t::describe_rank_map(trainer.mesh()->groups().shape).c_str());
  }
  std::fputs((t::format_rank_map(ranks) + t::format_memory_table(ranks, true)).c_str(), stderr);
  // A small file's validation split repeated its few windows without a
  // word (a review helper's case: 2 windows drawn 4000 times).
  const std::size_t val_bytes = t::split(corpus).val.size(), T = static_cast<std::size_t>(o.model.block_size);
  const std::size_t windows = val_bytes > T ? val_bytes - T : 0;
  const long long sequences = static_cast<long long>(o.eval_batches) * o.batch_size;
  if (windows > 0 && static_cast<unsigned long long>(sequences) > windows) {
    std::fprintf(stderr,
                 "braid-train: note: an evaluation draws %lld sequences (--eval-batches %d x --batch-size %d), "
                 "but the validation split (the last 10%% of the data, %zu bytes) holds %zu distinct windows of "
                 "%d bytes: they repeat; use more data for a validation loss that means more\n",
                 sequences, o.eval_batches, o.batch_size, val_bytes, windows, o.model.block_size);
  }
  if (trainer.step() >= o.steps) {
    std::fprintf(stderr,
                 "braid-train: nothing to train: the run starts at step %lld%s and --steps is %lld; "
                 "pass a larger --steps to train on\n",
                 static_cast<long long>(trainer.step()), o.resume.empty() ? "" : " (its checkpoint's)",
                 static_cast<long long>(o.steps));
  }
}

// The summary with every rank's memory and traffic (collective).
void print_summary(braid::trainer::Trainer& trainer, const braid::trainer::TrainSummary& summary,
                   const braid::runtime::RankInfo& info) {
  namespace t = braid::trainer;
  const auto ranks = t::gather_rank_stats(trainer, t::rank_stats(trainer, info.local_rank, node_index(trainer, info)));
  if (trainer.rank() != 0) return;
  std::string text = t::format_summary(summary, trainer.options());
  if (trainer.world_size() > 1 || trainer.strategy().comm() != nullptr) {
    const TrainOptions& o = trainer.options();
    const t::StepShape step{o.grad_accum, o.rank_micro_batch(trainer.strategy().world_size()), o.model.block_size};
    text += t::format_memory_table(ranks) + t::format_traffic_table(ranks, o.model, step);
  }
  std::fputs(text.c_str(), stdout);
}

// Every rank writes a shard of each step into its --checkpoint-dir, which
// rank 0 holds (DirectoryLock) and publishes. Ranks given other
// directories (a disk of their own node, a relative path from another
// working directory) trained the whole run and lost it at the first save;
// and ranks that wrote by name, with the directory replaced by another
// run's meanwhile, put their shards into that run's. So each rank other
// than 0 holds the directory too (DirectoryHold, through which its saves
// go), and the ranks check together, before training and before each save,
// that each sees rank 0's lock file through its hold and that the name
// still reaches what it holds; all refuse alike, naming the first rank that
// does not. Before each save rank 0 first takes the directory again if it
// was removed (DirectoryLock::reclaim), and the others then hold the new
// one. Nothing is checked where rank 0 could not take the lock (a file
// system without flock).
class SharedCheckpointDir : public braid::trainer::TrainObserver {
 public:
  // Collective over `world` (may be null): the check before training.
  SharedCheckpointDir(braid::comm::Communicator* world, const TrainOptions& o, braid::trainer::DirectoryLock* lock)
      : lock_(lock), dir_(o.checkpoint_dir) {
    using braid::comm::DataType;
    if (world == nullptr || world->size() == 1 || o.checkpoint_dir.empty() || o.eval_only) return;
    std::string expected = world->rank() == 0 && lock != nullptr ? lock->text() : std::string();
    std::int64_t length = static_cast<std::int64_t>(expected.size());
    world->broadcast(&length, &length, 1, DataType::i64, 0).wait();
    if (length == 0) return;
    expected.resize(static_cast<std::size_t>(length));
    world->broadcast(expected.data(), expected.data(), expected.size(), DataType::u8, 0).wait();
    world_ = world;
    expected_ = std::move(expected);
    if (world->rank() != 0) hold_ = braid::trainer::DirectoryHold::open(dir_);
    const int blind = first_blind();
    if (blind < 0) return;
    hold_.reset();
    throw braid::InvalidUsage(
        "rank " + std::to_string(blind) + " does not see rank 0's --checkpoint-dir" +
        (blind == world->rank() ? " (" + o.checkpoint_dir + " here)" : std::string()) +
        ": every rank writes its shard of each step there, so it must be one directory, on a file system every "
        "rank shares (a relative path needs the same working directory on every rank)");
  }

  // Whether the ranks check together before each save (every rank alike).
  bool shared() const { return world_ != nullptr; }

  void before_checkpoint(std::int64_t step) override {
    using braid::comm::DataType;
    enum : std::uint8_t { kKept, kTakenAgain, kUnguarded, kRefused };
    std::uint8_t what = kKept;
    std::string refusal;
    if (lock_ != nullptr) {
      try {
        if (lock_->reclaim()) what = lock_->guarded() ? kTakenAgain : kUnguarded;
      } catch (const braid::InvalidUsage& e) {
        if (world_ == nullptr) throw;
        what = kRefused;
        refusal = e.what();
      }
    }
    if (world_ == nullptr) return;
    world_->broadcast(&what, &what, 1, DataType::u8, 0).wait();
    if (what == kRefused) {
      std::int64_t length = static_cast<std::int64_t>(refusal.size());
      world_->broadcast(&length, &length, 1, DataType::i64, 0).wait();
      refusal.resize(static_cast<std::size_t>(length));
      world_->broadcast(refusal.data(), refusal.data(), refusal.size(), DataType::u8, 0).wait();
      throw braid::InvalidUsage(refusal);
    }
    if (what == kUnguarded) expected_.clear();  // rank 0 saves by name now, and so do the others
    if (what != kKept && world_->rank() != 0) {
      hold_.reset();
      if (!expected_.empty()) hold_ = braid::trainer::DirectoryHold::open(dir_);
    }
    if (expected_.empty()) return;
    const int blind = first_blind();
    if (blind < 0) return;
    throw braid::SystemError(dir_.string() + " is no longer the directory this run holds" +
                             (blind == world_->rank() ? std::string() : " on rank " + std::to_string(blind)) +
                             " (it was removed, renamed or replaced since the run took it, and may be another "
                             "run's now); nothing of step " + std::to_string(step) + " is saved there");
  }

 private:
  // Collective: the first rank that does not see rank 0's lock file through
  // its hold (or by name, where it holds none), or whose hold the name no
  // longer reaches; -1 when every rank does.
  int first_blind() {
    namespace t = braid::trainer;
    const std::filesystem::path held = t::DirectoryHold::held(dir_);
    std::string seen;
    if (std::ifstream file{t::DirectoryLock::path_in(held.empty() ? dir_ : held), std::ios::binary})
      seen.assign(std::istreambuf_iterator<char>(file), {});
    const std::uint8_t mine = seen == expected_ && t::DirectoryHold::still_named(dir_) ? 1 : 0;
    std::vector<std::uint8_t> all(static_cast<std::size_t>(world_->size()));
    world_->all_gather(&mine, all.data(), 1, braid::comm::DataType::u8).wait();
    const auto blind = std::find(all.begin(), all.end(), std::uint8_t{0});
    return blind == all.end() ? -1 : static_cast<int>(blind - all.begin());
  }

  braid::trainer::DirectoryLock* lock_;  // rank 0's
  std::filesystem::path dir_;
  braid::comm::Communicator* world_ = nullptr;  // set where the ranks check together
  std::string expected_;  // rank 0's lock file; empty once it goes unguarded
  std::unique_ptr<braid::trainer::DirectoryHold> hold_;  // the other ranks'
};

int run(const TrainOptions& o, const braid::runtime::RankInfo& info, braid::trainer::DirectoryLock* lock) {
  namespace t = braid::trainer;
  t::validate(o);
  // Under a launcher, rank 0 alone: every rank wrote the same --out, each
  // replacing the last, and each said so (a review helper's case).
  if (!o.consolidate.empty()) return info.rank == 0 ? consolidate(o) : 0;
  t::set_cuda_local_rank(info.local_rank);
  // Before the memory check, which plans a rank's share of that layout: an
  // int overflow of the kernels' indices is its own message.
  t::validate_rank_shapes(o, o.eval_only ? 1 : info.world_size);
  t::check_memory(o, info.world_size, info.local_world_size);
  if (o.device == "cpu") {
    braid::kernels::cpu::set_blas_threads(o.threads);
    braid::kernels::cpu::map_blas_buffers();  // before the run's own memory (gpt_ops.h)
  }
  const std::unique_ptr<braid::comm::Communicator> comm = connect(o, info);
  const t::TextCorpus corpus = o.data.empty() ? t::load_default_corpus() : t::load_text_file(o.data);
  t::Trainer trainer(o, corpus, comm.get());
  SharedCheckpointDir checkpoint_dir(trainer.world(), o, lock);
  trainer.start();
  if (o.eval_only) return eval_only(trainer, corpus, o);
  print_start(trainer, info, corpus);
  const bool rank0 = trainer.rank() == 0;
  t::ProgressPrinter progress(::isatty(STDERR_FILENO) != 0, o.log_interval);
  t::Observers observers;
  if (rank0) observers.add(&progress);
  if (lock != nullptr || checkpoint_dir.shared()) observers.add(&checkpoint_dir);
  std::optional<t::MetricsWriter> metrics;
  if (!o.metrics.empty()) {
    observers.add(&metrics.emplace(t::metrics_path(o.metrics, trainer.rank()), trainer.step()));
    if (rank0) t::settle_past_ranks_metrics(o.metrics, trainer.world() ? trainer.world()->size() : 1, trainer.step());
  }
  const t::TrainSummary summary = trainer.run(observers);
  print_summary(trainer, summary, info);
  print_sample(trainer, o);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    braid::runtime::setup_logging(0);  // reads BRAID_* (a bad value was an uncaught throw: abort, 134)
  } catch (const braid::InvalidUsage& e) {
    std::fprintf(stderr, "braid-train: error: %s\n", e.what());
    return 2;
  }
  TrainOptions options;
  CLI::App app{"braid-train: trains a byte-level GPT (GPT-2 shape) on one process or data-parallel"};
  // A flag given twice takes the last value, as argparse (torchrun,
  // nanoGPT) and getopt (braid-bench) do; CLI11 refused it ("At Most 1
  // required but received 2").
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_model_flags(app, options);
  add_run_flags(app, options);
  add_invocation_flags(app, options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  // Rank 0's hold on --checkpoint-dir: a run that fails before it saves
  // anything removes the directory where it made it (DirectoryLock::abandon).
  std::unique_ptr<braid::trainer::DirectoryLock> hold;
  try {
    const braid::runtime::RankInfo info = braid::runtime::rank_info_from_env();
    braid::runtime::setup_logging(info.rank);  // rank 1's first warnings said [rank 0]
    const std::set<std::string> given = explicit_keys(app);
    refuse_unused(given, options);
    apply_saved_options(given, info, options);
    refuse_ignored(given, options, info.world_size);
    hold = guard_checkpoint_dir(info, options);
    const int rc = run(options, info, hold.get());
    if (hold != nullptr) hold->abandon();  // "nothing to train" saved nothing in a directory it made
    return rc;
  } catch (const braid::InvalidUsage& e) {
    if (hold != nullptr) hold->abandon();
    std::fprintf(stderr, "braid-train: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    if (hold != nullptr) hold->abandon();
    std::fprintf(stderr,
                 "braid-train: failed: out of memory (an allocation failed after the memory check passed; it counts "
                 "parameters, gradients, AdamW state and activations, not every buffer of the libraries and "
                 "transports): lower the model or the micro-batch, or raise the limit (ulimit -v, the cgroup's "
                 "memory.max)\n");
    return 1;
  } catch (const std::exception& e) {
    if (hold != nullptr) hold->abandon();
    std::fprintf(stderr, "braid-train: failed: %s\n", e.what());
    return 1;
  }
}
