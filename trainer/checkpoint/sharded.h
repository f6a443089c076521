// Sharded checkpoints, written by every rank of a data-parallel run, and the
// reader of every checkpoint layout.
//
//   DIR/step_00000100/shard_00001_of_00004.safetensors   rank 1's pieces
//   DIR/step_00000100/manifest.json   state.json's content plus
//       "shards": {"world_size", "strategy", "files": [...]}
//   DIR/latest                        "step_00000100", replaced last
//
// A shard file holds the tensors a rank writes whole under their key and
// full shape (as any safetensors reader expects), and parts of tensors as
// 1-D pieces named "<key>@<first element>", where the key is the tensor's
// GPT-2 name for parameters and "m." / "v." + name for AdamW's moments (the
// names of the single-process files). The pieces of all shards tile every tensor exactly once; which
// rank writes which piece is the strategy's business (what it owns), so a
// checkpoint of any strategy and world size loads into any other.
//
// Commit protocol: every rank writes its shard atomically and fsyncs it, in
// the step's staging directory (layout.h); once every rank's shard is
// written (trainer/train/write_together.h: a slow disk delays this, a
// stuck one fails every rank), rank 0 removes
// whatever else an earlier save that died left there, writes manifest.json,
// renames the directory into place and only then moves `latest`. A save
// that dies leaves DIR/step_N.partial, never resumed from, and removed by
// the next step published after it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/safetensors.h"

namespace braid::trainer {

struct TensorPiece {
  std::string key;          // "h.0.ln_1.weight", "m.wte.weight", ...
  std::size_t offset = 0;   // first element inside the whole tensor (row-major)
  std::size_t count = 0;
  const float* data = nullptr;
};

// The staging directory (created) where every rank writes its shard of a
// checkpoint of `step` under `dir`.
std::filesystem::path prepare_step_directory(const std::filesystem::path& dir, std::int64_t step);
// This rank's shard file in the staging directory, written atomically
// (reporting to `progress` when given one). `save` names this save, the
// same on every rank; the manifest records it too, so a
// shard copied in from another run or another save of the step is refused
// when the checkpoint is read (one of the same step loaded without a word).
void write_shard(const std::filesystem::path& staging, int rank, int world_size,
                 const std::vector<TensorPiece>& pieces, const GptConfig& config, std::int64_t step,
                 WriteProgress* progress = nullptr, const std::string& save = "");
// The ranks whose shard of a world of `world_size` is not in `staging`:
// those that wrote it elsewhere (a node-local disk, a relative directory
// from another working directory).
std::vector<int> missing_shards(const std::filesystem::path& staging, int world_size);
// Rank 0, once every shard is durable: the manifest and `extra`, the step
// published, then `latest`, then pruning (layout::publish_step, which tells
// `progress` when the step is published). Returns the step directory.
// Refuses, publishing nothing, when a shard is missing.
std::filesystem::path commit_sharded_checkpoint(const std::filesystem::path& dir, const TrainState& state,
                                                int world_size, const std::string& strategy,
                                                const StepFiles& extra = {}, int keep = 2,
                                                const std::string& save = "", WriteProgress* progress = nullptr);

// Reads a training checkpoint of either layout (single-process or sharded)
// or a bare weights file. Opening reads and validates every file: the model
// config must agree between files, every file's step must be the state's,
// every tensor's data must match its checksum (safetensors.h). A training
// checkpoint's files must carry checksums; a bare weights file may lack
// them (another tool wrote it) and then loads with a warning.
class CheckpointReader {
 public:
  // A step directory (state.json or manifest.json).
  static CheckpointReader open(const std::filesystem::path& step_dir);
  // A safetensors weights file (save_weights); state() is empty.
  static CheckpointReader weights(const std::filesystem::path& file);

  const TrainState& state() const { return state_; }
  const GptConfig& config() const { return config_; }
  int world_size() const { return world_size_; }
  std::string strategy() const { return strategy_; }
  // What the checkpoint holds, as one number (SafetensorsFile::fingerprint
  // of each file in turn): equal on ranks that read copies of it.
  std::uint64_t fingerprint() const;

  // Throws InvalidUsage naming the file unless tensor `key` is stored
  // completely, with this shape.
  void check(const std::string& key, const std::vector<std::int64_t>& full_shape) const;
  // check(), then the whole tensor into `out`.
  void read(const std::string& key, const std::vector<std::int64_t>& full_shape, float* out) const;

 private:
  struct Piece {
    const SafetensorsFile* file;
    std::string entry;       // the tensor's name in the file
    std::size_t offset = 0;  // into the whole tensor
    std::size_t count = 0;
    bool whole = false;      // stored with the tensor's full shape
  };
  void add_file(SafetensorsFile file, const std::string& prefix, bool pieces);
  void check_file(const SafetensorsFile& file) const;
  [[noreturn]] void fail(const std::string& problem) const;

  std::string save_;  // the save that wrote the checkpoint, if it says
  std::string save_source_ = "manifest";  // where save_ comes from: the manifest or state.json
  std::filesystem::path where_;
  TrainState state_;
  GptConfig config_;
  int world_size_ = 1;
  std::string strategy_ = "none";
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::vector<Piece>> pieces_;  // by key, sorted by offset
};

// Writes the parameters of a training checkpoint of either layout (a
// checkpoint directory follows `latest`) as one safetensors weights file
// that the single-process trainer loads with --init-from. Returns the step.
std::int64_t consolidate_checkpoint(const std::filesystem::path& checkpoint, const std::filesystem::path& out);

}  // namespace braid::trainer
