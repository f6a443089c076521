#include "trainer/checkpoint/sharded.h"

#include <algorithm>
#include <cstdio>

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "runtime/errors.h"
#include "trainer/checkpoint/atomic_file.h"
#include "trainer/checkpoint/layout.h"
#include "trainer/model/param_table.h"

namespace braid::trainer {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string shard_name(int rank, int world_size) {
  char name[64];
  std::snprintf(name, sizeof(name), "shard_%05d_of_%05d.safetensors", rank, world_size);
  return name;
}

std::size_t element_count(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

// Every parameter's shape in the whole model, by GPT-2 name.
std::map<std::string, std::vector<std::int64_t>> full_shapes(const GptConfig& config) {
  std::map<std::string, std::vector<std::int64_t>> shapes;
  const ParamTable table = ParamTable::gpt(config, ModelLayout::whole(config));
  for (const ParamView& v : table.views()) shapes[v.name] = v.full_shape;
  return shapes;
}

}  // namespace

fs::path prepare_step_directory(const fs::path& dir, std::int64_t step) {
  return layout::open_staging(dir, step, false);
}

void write_shard(const fs::path& staging, int rank, int world_size, const std::vector<TensorPiece>& pieces,
                 const GptConfig& config, std::int64_t step, WriteProgress* progress, const std::string& save) {
  const std::map<std::string, std::vector<std::int64_t>> shapes = full_shapes(config);
  std::vector<TensorToWrite> tensors;
  for (const TensorPiece& p : pieces) {
    // A whole tensor under its own name and shape, as any safetensors reader
    // expects; a part of one as a 1-D piece named <key>@<offset>.
    const std::string name = p.key.rfind("m.", 0) == 0 || p.key.rfind("v.", 0) == 0 ? p.key.substr(2) : p.key;
    const auto it = shapes.find(name);
    if (p.offset == 0 && it != shapes.end() && element_count(it->second) == p.count) {
      tensors.push_back({p.key, it->second, p.data});
    } else {
      tensors.push_back({p.key + "@" + std::to_string(p.offset), {static_cast<std::int64_t>(p.count)}, p.data});
    }
  }
  Metadata metadata = config_metadata(config, step);
  metadata["rank"] = std::to_string(rank);
  metadata["world_size"] = std::to_string(world_size);
  if (!save.empty()) metadata["save"] = save;
  write_safetensors(staging / shard_name(rank, world_size), tensors, metadata, progress);
}

std::vector<int> missing_shards(const fs::path& staging, int world_size) {
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r)
    if (!fs::is_regular_file(staging / shard_name(r, world_size))) missing.push_back(r);
  return missing;
}

fs::path commit_sharded_checkpoint(const fs::path& dir, const TrainState& state, int world_size,
                                   const std::string& strategy, const StepFiles& extra, int keep,
                                   const std::string& save, WriteProgress* progress) {
  const fs::path staging = layout::staging_dir(dir, state.step);
  if (const std::vector<int> missing = missing_shards(staging, world_size); !missing.empty()) {
    throw SystemError("the checkpoint of step " + std::to_string(state.step) + " is not published: " +
                      std::to_string(missing.size()) + " of its " + std::to_string(world_size) + " shards (rank " +
                      std::to_string(missing.front()) + "'s first) are not in " + staging.string());
  }
  json manifest = layout::state_json(state);
  json files = json::array();
  std::vector<std::string> shards;
  for (int r = 0; r < world_size; ++r) shards.push_back(shard_name(r, world_size));
  for (const std::string& name : shards) files.push_back(name);
  manifest["shards"] = {{"world_size", world_size}, {"strategy", strategy}, {"files", files}};
  if (!save.empty()) manifest["shards"]["save"] = save;
  layout::tidy_staging(staging, shards);
  layout::write_files(staging, extra);
  write_file_atomically(staging / layout::kManifestFile, layout::sealed_text(manifest));
  return layout::publish_step(dir, state.step, keep, progress);
}

// ---------------------------------------------------------------------------
// CheckpointReader

void CheckpointReader::fail(const std::string& problem) const {
  throw InvalidUsage("checkpoint " + where_.string() + " is refused: " + problem);
}

CheckpointReader CheckpointReader::weights(const fs::path& file) {
  CheckpointReader r;
  r.where_ = file;
  r.add_file(SafetensorsFile::read(file), "", false);
  r.config_ = config_from_metadata(*r.files_.front());
  if (!r.files_.front()->checksummed()) {
    spdlog::warn("{} carries no checksums (not written by braid?); its tensors load unverified", file.string());
  }
  return r;
}

CheckpointReader CheckpointReader::open(const fs::path& step_dir) {
  CheckpointReader r;
  r.where_ = step_dir;
  const fs::path manifest = step_dir / layout::kManifestFile;
  if (!fs::exists(manifest)) {
    const fs::path state = step_dir / layout::kStateFile;
    const json j = layout::read_json(state);
    r.state_ = layout::parse_state(j, state);
    r.save_ = j.contains("save") && j["save"].is_string() ? j["save"].get<std::string>() : std::string();
    r.save_source_ = layout::kStateFile;
    r.add_file(SafetensorsFile::read(step_dir / layout::kModelFile), "", false);
    r.add_file(SafetensorsFile::read(step_dir / layout::kOptimizerFile), "", false);
  } else {
    const json m = layout::read_json(manifest);
    r.state_ = layout::parse_state(m, manifest);
    try {
      r.world_size_ = m.at("shards").at("world_size").get<int>();
      r.strategy_ = m.at("shards").at("strategy").get<std::string>();
      r.save_ = m.at("shards").value("save", std::string());
      for (const auto& name : m.at("shards").at("files")) {
        const std::string file = name.get<std::string>();
        if (file.find('/') != std::string::npos) throw InvalidUsage("shard file '" + file + "' is not a plain name");
        r.add_file(SafetensorsFile::read(step_dir / file), "", true);
      }
    } catch (const json::exception& e) {
      r.fail(std::string("its manifest's \"shards\" is malformed (") + e.what() + ")");
    }
    if (r.files_.size() != static_cast<std::size_t>(r.world_size_)) r.fail("its manifest lists the wrong number of shards");
  }
  r.config_ = config_from_metadata(*r.files_.front());
  for (const auto& f : r.files_) r.check_file(*f);
  // A manifest or state file that names no save (edited, with its checksum
  // line removed as README allows) checked the files against nothing: the
  // files of two saves, each naming its own, loaded as one model.
  if (r.save_.empty()) {
    const SafetensorsFile* named = nullptr;
    for (const auto& f : r.files_) {
      const auto save = f->metadata().find("save");
      if (save == f->metadata().end()) continue;
      if (named == nullptr) {
        named = f.get();
      } else if (save->second != named->metadata().at("save")) {
        r.fail(f->path().filename().string() + " was written by save '" + save->second + "' and " +
               named->path().filename().string() + " by save '" + named->metadata().at("save") +
               "': files of two saves would mix two models");
      }
    }
  }
  return r;
}

std::uint64_t CheckpointReader::fingerprint() const {
  std::vector<std::uint64_t> each;
  for (const auto& f : files_) each.push_back(f->fingerprint());
  return XXH3_64bits(each.data(), each.size() * sizeof(std::uint64_t));
}

void CheckpointReader::check_file(const SafetensorsFile& f) const {
  // Only braid writes training checkpoints, and it always writes checksums:
  // a file without them was swapped in or had them stripped.
  if (!f.checksummed()) {
    throw InvalidUsage("checkpoint " + f.path().string() +
                       " is refused: it carries no checksums, but braid writes them into every checkpoint file; "
                       "it was replaced, edited, or written by another tool (weights without checksums load "
                       "through --init-from)");
  }
  const GptConfig got = config_from_metadata(f);
  if (!(got == config_)) {
    fail(f.path().filename().string() + " holds a model with " + describe(got) + ", but " +
         files_.front()->path().filename().string() + " one with " + describe(config_));
  }
  // Checkpoints written before saves were named carry none.
  const auto save = f.metadata().find("save");
  if (!save_.empty() && (save == f.metadata().end() || save->second != save_)) {
    fail(f.path().filename().string() + " was written by another save than its " + save_source_ + " (save '" +
         (save == f.metadata().end() ? std::string("none") : save->second) + "', the " + save_source_ + "'s '" +
         save_ + "'): a file copied in from another run or another save of this step would mix two models");
  }
  if (layout::metadata_int(f, "step") != state_.step) {
    throw InvalidUsage("checkpoint " + f.path().string() + " is refused: it is from step " +
                       f.metadata_value("step") + " but the checkpoint's state says step " +
                       std::to_string(state_.step));
  }
}

void CheckpointReader::add_file(SafetensorsFile file, const std::string& prefix, bool pieces) {
  files_.push_back(std::make_unique<SafetensorsFile>(std::move(file)));
  const SafetensorsFile* f = files_.back().get();
  for (const std::string& name : f->names()) {
    const std::vector<std::int64_t>& shape = f->shape(name);
    Piece p{f, name, 0, element_count(shape), !pieces};
    std::string key = prefix + name;
    const std::size_t at = name.rfind('@');
    if (pieces && at == std::string::npos) {
      p.whole = true;  // a whole tensor in a shard: its shape is checked against the model's
    } else if (pieces) {
      if (shape.size() != 1) {
        fail(f->path().filename().string() + " holds '" + name + "', not a 1-D piece named <tensor>@<offset>");
      }
      key = prefix + name.substr(0, at);
      try {
        p.offset = std::stoull(name.substr(at + 1));
      } catch (const std::exception&) {
        fail(f->path().filename().string() + " holds '" + name + "' whose offset is not a number");
      }
    }
    auto& list = pieces_[key];
    list.insert(std::upper_bound(list.begin(), list.end(), p,
                                 [](const Piece& a, const Piece& b) { return a.offset < b.offset; }),
                p);
  }
}

void CheckpointReader::check(const std::string& key, const std::vector<std::int64_t>& full_shape) const {
  auto it = pieces_.find(key);
  if (it == pieces_.end()) fail("tensor '" + key + "' is missing");
  const std::size_t total = element_count(full_shape);
  std::size_t next = 0;
  for (const Piece& p : it->second) {
    if (p.whole) p.file->check(p.entry, full_shape);
    if (p.offset != next) {
      fail("tensor '" + key + "' has " + (p.offset > next ? "a gap" : "overlapping pieces") + " at element " +
           std::to_string(std::min(p.offset, next)) + " (a shard is missing or from another run)");
    }
    next += p.count;
  }
  if (next != total) {
    fail("tensor '" + key + "' holds " + std::to_string(next) + " elements, expected " + std::to_string(total) +
         " for shape " + shape_string(full_shape));
  }
}

void CheckpointReader::read(const std::string& key, const std::vector<std::int64_t>& full_shape, float* out) const {
  check(key, full_shape);
  for (const Piece& p : pieces_.at(key)) {
    if (p.whole) {
      p.file->copy(p.entry, full_shape, out);
    } else {
      p.file->copy(p.entry, {static_cast<std::int64_t>(p.count)}, out + p.offset);
    }
  }
}

std::int64_t consolidate_checkpoint(const fs::path& checkpoint, const fs::path& out) {
  const CheckpointReader r = CheckpointReader::open(resolve_checkpoint(checkpoint));
  const ParamTable table = ParamTable::gpt(r.config(), ModelLayout::whole(r.config()));
  std::vector<std::vector<float>> values;
  std::vector<TensorToWrite> tensors;
  for (const ParamView& v : table.views()) r.check(v.name, v.full_shape);
  for (const ParamView& v : table.views()) {
    values.emplace_back(v.count());
    r.read(v.name, v.full_shape, values.back().data());
    tensors.push_back({v.name, v.full_shape, values.back().data()});
  }
  write_safetensors(out, tensors, config_metadata(r.config(), r.state().step));
  return r.state().step;
}

}  // namespace braid::trainer
