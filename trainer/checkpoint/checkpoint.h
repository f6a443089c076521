// Checkpoints: the model's weights and the full training state.
//
// Weights are one safetensors file with every parameter under its GPT-2
// name and full shape, and the model config (n_layer, n_head, n_embd,
// block_size, vocab_size) plus the step in its __metadata__.
//
// A training checkpoint is a directory per step under --checkpoint-dir:
//   DIR/step_00000100/model.safetensors      weights
//   DIR/step_00000100/optimizer.safetensors  AdamW state: m.<name>, v.<name>
//   DIR/step_00000100/state.json             step, run options, data position,
//                                            the parallel layout that wrote it
//   DIR/latest                               "step_00000100", replaced last
// A step is written in DIR/step_00000100.partial and renamed into place once
// its files are durable, then `latest` moves (layout.h): a crash or a
// failed save at any point leaves every earlier checkpoint intact, and a
// step directory never mixes the files of two saves. The data position is the step alone: batches are a
// function of (seed, step, index) (trainer/data/text_data.h).
//
// Loading reads and validates every file completely before it changes any
// buffer; a refused checkpoint leaves the model, the optimizer and the files
// untouched. Data-parallel runs write a sharded layout instead (sharded.h);
// CheckpointReader reads both, so either loads here and in any strategy.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "trainer/checkpoint/safetensors.h"
#include "trainer/model/gpt.h"
#include "trainer/optim/adamw.h"

namespace braid::trainer {

Metadata config_metadata(const GptConfig& config, std::int64_t step);
// Throws InvalidUsage naming the file when a key is missing or not a number.
GptConfig config_from_metadata(const SafetensorsFile& file);
GptConfig read_weights_config(const std::filesystem::path& path);

void save_weights(const std::filesystem::path& path, const Gpt& model, std::int64_t step);
// Refuses a file whose config differs from the model's.
void load_weights(const std::filesystem::path& path, Gpt& model);

// The parallel layout that wrote a checkpoint; a resume restores it unless
// told otherwise (train/resume.h). strategy is empty where not recorded.
struct SavedLayout {
  std::string strategy;  // "none", "ddp", "zero2", ...
  int dp = 1;
  int tp = 1;
  int pp = 1;

  int world_size() const { return dp * tp * pp; }
  bool operator==(const SavedLayout&) const = default;
  // "zero2 on dp=2 tp=1 pp=1"
  std::string describe() const;
};

struct TrainState {
  std::int64_t step = 0;           // steps completed; the next step to run
  nlohmann::json options;          // the run's options (train/options.h)
  std::string data_source;
  std::uint64_t data_bytes = 0;
  std::uint64_t data_fingerprint = 0;
  SavedLayout layout = {};
  // The job that wrote it (RankInfo::run_id; empty where unknown): a
  // restarted job resumes from its own checkpoints, not from those of an
  // earlier job in the same directory.
  std::string run_id = {};
};

// Files a save adds to its step beside the checkpoint's own, by name (the
// trainer's config.json); they are published with the step.
using StepFiles = std::map<std::string, std::string>;

// DIR/step_<step>: where a checkpoint of `step` is once published.
std::filesystem::path step_directory(const std::filesystem::path& dir, std::int64_t step);

// Writes DIR/step_<step>/..., then DIR/latest; keeps the step and the newest
// keep - 1 steps before it (layout::prune_steps).
std::filesystem::path save_checkpoint(const std::filesystem::path& dir, const Gpt& model, const AdamW& optimizer,
                                      const TrainState& state, const StepFiles& extra = {}, int keep = 2);
// A checkpoint directory (follows `latest`) or one step directory (it holds
// state.json or, sharded, manifest.json).
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);
TrainState read_train_state(const std::filesystem::path& step_dir);
// Validates everything, then loads weights and optimizer state.
TrainState load_checkpoint(const std::filesystem::path& step_dir, Gpt& model, AdamW& optimizer);

}  // namespace braid::trainer
