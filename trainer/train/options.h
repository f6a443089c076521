// Everything a braid-train run is told, with its defaults, and the checks
// that refuse a bad combination before any work (InvalidUsage; braid-train
// exits 2). Names follow nanoGPT's config keys; the CLI flag of key `n_layer`
// is `--n-layer`.
//
// The "run options" (model shape, batch, schedule, seed, data, evaluation,
// checkpoint cadence) define a training run and are saved in checkpoints, so
// `--resume DIR` continues with the saved values of every key not given on
// the command line. The rest (what to print or write, threads, where
// checkpoints go) belong to one invocation; the parallel layout (strategy,
// dp, tp, pp) is saved beside them and restored as train/resume.h says.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "trainer/model/gpt_config.h"

namespace braid::trainer {

inline constexpr int kThreadsPerHardwareThread = 4;

struct TrainOptions {
  // Run options, saved in checkpoints.
  GptConfig model{4, 4, 128, 64, 256};
  int batch_size = 16;             // GLOBAL batch in sequences, split evenly across the ranks
  int grad_accum = 1;              // micro-batches per step; must divide batch_size
  std::int64_t steps = 500;
  float lr = 3e-3f;                // peak learning rate
  float min_lr = 3e-4f;            // end of the cosine decay
  std::int64_t warmup_steps = 20;
  float weight_decay = 0.1f;       // decoupled, on 2-D weights only
  float grad_clip = 1.0f;          // max global gradient norm; 0 disables
  std::uint64_t seed = 1337;
  std::string data;                // empty: the default corpus
  std::int64_t eval_interval = 100;  // steps between val evaluations; 0: only at the end
  int eval_batches = 8;            // batches (of batch_size sequences) per evaluation
  std::int64_t checkpoint_interval = 0;  // steps between checkpoints; 0: only at the end

  // Per invocation.
  std::string checkpoint_dir;      // empty: no checkpoints (a resumed run: beside its checkpoint, resume.h)
  std::string resume;              // checkpoint directory to continue from
  std::int64_t resume_step = -1;   // the step --resume resolved to (apply_resume); not a flag
  std::string init_from;           // safetensors weights, or a checkpoint directory (its latest step), to start from
  std::string init_out;            // write the initial weights here
  std::string metrics;             // JSON lines, one per step
  std::int64_t log_interval = 0;   // steps between printed lines; 0: about 20 lines (a bar on a terminal)
  std::string config;              // JSON file of settings (run_options_json's keys + the layout's)
  std::string run_id;              // the launcher's (RankInfo::run_id), recorded in checkpoints; no flag
  bool eval_only = false;          // mean loss of --init-from/--resume over --data's windows
  int sample_bytes = 0;            // generate this many bytes at the end
  float temperature = 0.8f;        // 0: greedy
  std::string prompt = "\n";
  int threads = 1;                 // BLAS threads (per rank), 1..kThreadsPerHardwareThread x hardware threads
  std::string device = "cpu";      // cpu|cuda: where every buffer and op of the run lives
  // Data parallelism. A resume restores the checkpoint's strategy and
  // layout unless the command line or the world size changes them.
  std::string strategy;            // none|dp|ddp|zero1|zero2|zero3; empty: none on one rank, ddp on more
  double bucket_mb = 25.0;         // gradient bucket (ddp, zero1, zero2), MiB
  // The mesh (issue 6): world = dp x tp x pp, dp 0: world / (tp x pp).
  // grad_accum is the micro-batch count M of a pipeline's schedule.
  int dp = 0;
  int tp = 1;
  int pp = 1;
  // gpipe|1f1b. Saved with the run options, so a resume keeps it unless
  // given (it changes memory and speed, not the result).
  std::string schedule = "1f1b";
  std::string consolidate;         // write this checkpoint's weights to `out` as one file, then exit
  std::string out;

  // The global batch is cut into world_size equal shares, each into
  // grad_accum equal micro-batches (validate_world refuses other batches).
  int micro_batch() const { return batch_size / grad_accum; }
  int rank_micro_batch(int dp_size) const { return batch_size / (grad_accum * dp_size); }
  bool model_parallel() const { return tp > 1 || pp > 1; }
  // The DP size in a world of `world_size` ranks.
  // tp x pp in 64 bits: --tp 65536 --pp 65536 wrapped to 0 in int, and
  // the division by it killed the rank with SIGFPE before any check.
  int dp_size(int world_size) const {
    return dp > 0 ? dp : static_cast<int>(world_size / (static_cast<std::int64_t>(tp) * pp));
  }
  std::int64_t tokens_per_step() const { return static_cast<std::int64_t>(batch_size) * model.block_size; }
};

// The run options as JSON, keyed by nanoGPT names ("n_layer", "lr", ...).
nlohmann::json run_options_json(const TrainOptions& options);
// Sets the run options present in `saved`, except the keys in `keep`
// (those given on the command line win). Throws InvalidUsage on bad types.
void apply_run_options(const nlohmann::json& saved, const std::set<std::string>& keep, TrainOptions& options);

// The settings that repeat a run: run_options_json (the pipeline's
// "schedule" among them) plus the parallel layout ("strategy", "dp", "tp",
// "pp"). --config reads this shape and
// every checkpoint step directory holds it as config.json.
nlohmann::json config_json(const TrainOptions& options);
// Reads a --config file into `options`, except the keys in `keep` (given on
// the command line). InvalidUsage names the file and any key it does not
// know, so a typo is not silently ignored. Returns the keys it set.
std::set<std::string> apply_config_file(const std::string& path, const std::set<std::string>& keep,
                                        TrainOptions& options);

// Checks the options alone (before the data is read).
void validate(const TrainOptions& options);
// Checks that dp x tp x pp is the world, that the global batch splits
// into dp x grad_accum equal micro-batches, and validate_rank_shapes;
// InvalidUsage says what to change. --eval-only is a world of one.
void validate_world(const TrainOptions& options, int world_size);
// Checks that a rank's micro-batch (of its heads) fits the kernels' int
// indices, where the layout fits `world_size` (validate_world refuses the
// others).
void validate_rank_shapes(const TrainOptions& options, int world_size);
// Checks the options against the data: both splits, or for --eval-only the
// whole file, must hold one window of block_size + 1 bytes.
void validate_data(const TrainOptions& options, std::size_t train_bytes, std::size_t val_bytes);

}  // namespace braid::trainer
