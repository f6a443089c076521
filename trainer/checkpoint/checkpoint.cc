#include "trainer/checkpoint/checkpoint.h"

#include <algorithm>
#include <fstream>
#include <vector>

#include "runtime/errors.h"
#include "trainer/checkpoint/atomic_file.h"
#include "trainer/checkpoint/layout.h"
#include "trainer/checkpoint/sharded.h"

namespace braid::trainer {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void check_config(const CheckpointReader& r, const fs::path& where, const GptConfig& expected) {
  if (!(r.config() == expected)) {
    throw InvalidUsage("checkpoint " + where.string() + " holds a model with " + describe(r.config()) +
                       ", but this run's model has " + describe(expected) + "; pass the checkpoint's sizes");
  }
}

// Checks that every tensor of the table is in the checkpoint (key prefix +
// name) with its full shape.
void check_tensors(const CheckpointReader& r, const ParamTable& table, const std::string& prefix) {
  for (const ParamView& v : table.views()) r.check(prefix + v.name, v.full_shape);
}

// Copies the tensors' parts inside `owned` to dst (dst[0] is owned.offset),
// in the memory of the model's device.
void copy_tensors(const CheckpointReader& r, const Gpt& model, const std::string& prefix, Range owned, float* dst) {
  std::vector<float> full, local;
  for (const ParamView& v : model.table().views()) {
    const Range part = intersect(v.range(), owned);
    if (part.count == 0) continue;
    std::size_t full_count = 1;
    for (auto d : v.full_shape) full_count *= static_cast<std::size_t>(d);
    full.resize(full_count);
    local.resize(v.count());
    r.read(prefix + v.name, v.full_shape, full.data());
    copy_tp_part(v, model.layout(), full.data(), local.data());
    model.ops().from_host(dst + (part.offset - owned.offset), local.data() + (part.offset - v.offset),
                          part.count * sizeof(float));
  }
}

// The elements of `buffer` in host memory: the buffer itself on the CPU,
// else a copy kept in `copy`.
const float* on_host(const FlatBuffer& buffer, std::vector<float>& copy) {
  if (buffer.device() == Device::kCpu) return buffer.data();
  copy.resize(buffer.count());
  buffer.backend().to_host(copy.data(), buffer.data(), copy.size() * sizeof(float));
  return copy.data();
}

std::vector<TensorToWrite> named_tensors(const Gpt& model, const std::string& prefix, const float* base) {
  if (model.layout().tp_size != 1) {
    throw InvalidUsage("saving a tensor-parallel model needs its parts gathered to one rank first");
  }
  std::vector<TensorToWrite> tensors;
  for (const ParamView& v : model.table().views()) {
    tensors.push_back({prefix + v.name, v.shape, base + v.offset});
  }
  return tensors;
}

}  // namespace

std::string SavedLayout::describe() const {
  return strategy + " on dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp);
}

Metadata config_metadata(const GptConfig& c, std::int64_t step) {
  return Metadata{{"format", "braid-gpt"},
                  {"n_layer", std::to_string(c.n_layer)},
                  {"n_head", std::to_string(c.n_head)},
                  {"n_embd", std::to_string(c.n_embd)},
                  {"block_size", std::to_string(c.block_size)},
                  {"vocab_size", std::to_string(c.vocab_size)},
                  {"step", std::to_string(step)}};
}

GptConfig config_from_metadata(const SafetensorsFile& f) {
  GptConfig c;
  c.n_layer = static_cast<int>(layout::metadata_int(f, "n_layer"));
  c.n_head = static_cast<int>(layout::metadata_int(f, "n_head"));
  c.n_embd = static_cast<int>(layout::metadata_int(f, "n_embd"));
  c.block_size = static_cast<int>(layout::metadata_int(f, "block_size"));
  c.vocab_size = static_cast<int>(layout::metadata_int(f, "vocab_size"));
  try {
    validate(c);
  } catch (const InvalidUsage& e) {
    throw InvalidUsage("checkpoint " + f.path().string() + " is refused: its config is invalid: " + e.what());
  }
  return c;
}

GptConfig read_weights_config(const fs::path& path) { return config_from_metadata(SafetensorsFile::read(path)); }

void save_weights(const fs::path& path, const Gpt& model, std::int64_t step) {
  std::vector<float> copy;
  write_safetensors(path, named_tensors(model, "", on_host(model.params(), copy)),
                    config_metadata(model.config(), step));
}

void load_weights(const fs::path& path, Gpt& model) {
  const CheckpointReader r = CheckpointReader::weights(path);
  check_config(r, path, model.config());
  check_tensors(r, model.table(), "");
  copy_tensors(r, model, "", Range{0, model.table().count()}, model.params().data());
}

fs::path save_checkpoint(const fs::path& checkpoint_dir, const Gpt& model, const AdamW& opt, const TrainState& s,
                         const StepFiles& extra, int keep) {
  if (opt.owned() != std::vector<Range>{Range{0, model.table().count()}}) {
    throw InvalidUsage("saving a sharded optimizer state needs its shards gathered to one rank first");
  }
  return through_hold(checkpoint_dir, [&](const fs::path& dir) {
    // The step's files go to its staging directory, which is published whole.
    const fs::path staging = layout::open_staging(dir, s.step, true);
    // Every file carries the save's name, so that one copied in from another
    // run or save of the step is refused when read (as a shard is).
    const std::string save = layout::new_save_id();
    Metadata metadata = config_metadata(model.config(), s.step);
    metadata["save"] = save;
    try {
      std::vector<float> weights;
      write_safetensors(staging / layout::kModelFile, named_tensors(model, "", on_host(model.params(), weights)),
                        metadata);
      std::vector<float> m, v;
      std::vector<TensorToWrite> tensors = named_tensors(model, "m.", on_host(opt.m(), m));
      for (auto& t : named_tensors(model, "v.", on_host(opt.v(), v))) tensors.push_back(std::move(t));
      write_safetensors(staging / layout::kOptimizerFile, tensors, metadata);
      json state = layout::state_json(s);
      state["save"] = save;
      write_file_atomically(staging / layout::kStateFile, layout::sealed_text(state));
      layout::write_files(staging, extra);
    } catch (...) {
      // A save that failed (a full disk, say) leaves nothing half-written
      // behind; the step's directory, if it had one, and `latest` are as they
      // were.
      std::error_code ignored;
      fs::remove_all(staging, ignored);
      throw;
    }
    try {
      return layout::publish_step(dir, s.step, keep);
    } catch (...) {
      // Failed before the rename (its fsync), or after it (where the step is
      // whole and this holds nothing, or the step's previous files).
      std::error_code ignored;
      fs::remove_all(staging, ignored);
      throw;
    }
  });
}

fs::path step_directory(const fs::path& dir, std::int64_t step) { return dir / layout::step_dir_name(step); }

fs::path resolve_checkpoint(const fs::path& path) {
  if (layout::is_complete(path)) return path;
  // "is not a braid-train checkpoint: it has neither state.json ..." of a
  // path mistyped, or of a directory a failed first run removed.
  std::error_code ec;
  if (!fs::exists(path, ec) && !ec)
    throw InvalidUsage(path.string() + " does not exist: pass a checkpoint directory (--checkpoint-dir's) or one "
                       "of its step directories");
  std::ifstream in(path / layout::kLatest);
  std::string name;
  if (!in) {
    // A save that failed between publishing its step and naming it in
    // `latest` (the first save of a run, on a disk that filled up) left a
    // whole step: "not a checkpoint, pass --checkpoint-dir's directory"
    // named the very directory given.
    if (const auto step = layout::newest_complete_step(path))
      throw InvalidUsage(path.string() + " has no readable '" + layout::kLatest + "' (a save that failed before "
                         "naming its step?), but holds the complete step " + step->filename().string() +
                         ": pass that step directory (" + step->string() + ")");
    throw InvalidUsage(path.string() + " is not a braid-train checkpoint: it has neither " + layout::kStateFile +
                       ", " + layout::kManifestFile + " nor a readable '" + layout::kLatest +
                       "' file; pass --checkpoint-dir's directory");
  }
  std::string rest;
  if (!(in >> name) || name.find('/') != std::string::npos || (in >> rest))
    throw InvalidUsage(path.string() + "/" + layout::kLatest + " does not name a step (" +
                       (name.empty() ? std::string("it is empty")
                                     : "it says '" + name + (rest.empty() ? "" : " " + rest + "...") + "'") +
                       "); pass one of the step directories in " + path.string() + " instead");
  // A `latest` whose step is gone (removed by hand, or a copy without it):
  // "cannot open .../state.json" did not say which file was stale.
  if (!layout::is_complete(path / name))
    throw InvalidUsage(path.string() + "/" + layout::kLatest + " names " + name + ", which is not a complete step in " +
                       path.string() + " (removed, or copied without it?); pass one of its step directories instead");
  return path / name;
}

TrainState read_train_state(const fs::path& step_dir) {
  const fs::path manifest = step_dir / layout::kManifestFile;
  const fs::path path = fs::exists(manifest) ? manifest : step_dir / layout::kStateFile;
  return layout::parse_state(layout::read_json(path), path);
}

TrainState load_checkpoint(const fs::path& step_dir, Gpt& model, AdamW& opt) {
  const CheckpointReader r = CheckpointReader::open(step_dir);
  check_config(r, step_dir, model.config());
  for (const char* prefix : {"", "m.", "v."}) check_tensors(r, model.table(), prefix);
  copy_tensors(r, model, "", Range{0, model.table().count()}, model.params().data());
  for (std::size_t i = 0; i < opt.owned().size(); ++i) {
    copy_tensors(r, model, "m.", opt.owned()[i], opt.m().data() + opt.state_offset(i));
    copy_tensors(r, model, "v.", opt.owned()[i], opt.v().data() + opt.state_offset(i));
  }
  return r.state();
}

}  // namespace braid::trainer
