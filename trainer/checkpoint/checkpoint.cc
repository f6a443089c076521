#include "trainer/checkpoint/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "runtime/errors.h"
#include "trainer/checkpoint/atomic_file.h"

namespace braid::trainer {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kLatest = "latest";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";

std::string step_dir_name(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

std::int64_t metadata_int(const SafetensorsFile& f, const std::string& key) {
  const std::string& text = f.metadata_value(key);
  try {
    std::size_t used = 0;
    long long value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw InvalidUsage("checkpoint " + f.path().string() + " is refused: __metadata__ '" + key + "' is '" + text +
                     "', not an integer");
}

void check_config(const SafetensorsFile& f, const GptConfig& expected) {
  GptConfig got = config_from_metadata(f);
  if (!(got == expected)) {
    throw InvalidUsage("checkpoint " + f.path().string() + " holds a model with " + describe(got) +
                       ", but this run's model has " + describe(expected) + "; pass the checkpoint's sizes");
  }
}

// Checks that every tensor of the table is in the file (name + prefix) with
// its full shape.
void check_tensors(const SafetensorsFile& f, const ParamTable& table, const std::string& prefix) {
  for (const ParamView& v : table.views()) f.check(prefix + v.name, v.full_shape);
}

// Copies the tensors' parts inside `owned` to dst (dst[0] is owned.offset).
void copy_tensors(const SafetensorsFile& f, const Gpt& model, const std::string& prefix, Range owned, float* dst) {
  std::vector<float> full, local;
  for (const ParamView& v : model.table().views()) {
    const Range r = intersect(v.range(), owned);
    if (r.count == 0) continue;
    std::size_t full_count = 1;
    for (auto d : v.full_shape) full_count *= static_cast<std::size_t>(d);
    full.resize(full_count);
    local.resize(v.count());
    f.copy(prefix + v.name, v.full_shape, full.data());
    copy_tp_part(v, model.layout(), full.data(), local.data());
    std::copy_n(local.data() + (r.offset - v.offset), r.count, dst + (r.offset - owned.offset));
  }
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

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw InvalidUsage("cannot open " + path.string() + "; is this a braid-train checkpoint?");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw InvalidUsage("checkpoint state " + path.string() + " is refused: not valid JSON (" + e.what() + ")");
  }
}

void prune(const fs::path& dir, int keep) {
  std::vector<fs::path> steps;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step_", 0) == 0) steps.push_back(entry.path());
  }
  std::sort(steps.begin(), steps.end());
  for (std::size_t i = 0; i + keep < steps.size(); ++i) fs::remove_all(steps[i]);
}

}  // namespace

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
  c.n_layer = static_cast<int>(metadata_int(f, "n_layer"));
  c.n_head = static_cast<int>(metadata_int(f, "n_head"));
  c.n_embd = static_cast<int>(metadata_int(f, "n_embd"));
  c.block_size = static_cast<int>(metadata_int(f, "block_size"));
  c.vocab_size = static_cast<int>(metadata_int(f, "vocab_size"));
  try {
    validate(c);
  } catch (const InvalidUsage& e) {
    throw InvalidUsage("checkpoint " + f.path().string() + " is refused: its config is invalid: " + e.what());
  }
  return c;
}

GptConfig read_weights_config(const fs::path& path) { return config_from_metadata(SafetensorsFile::read(path)); }

void save_weights(const fs::path& path, const Gpt& model, std::int64_t step) {
  write_safetensors(path, named_tensors(model, "", model.params().data()), config_metadata(model.config(), step));
}

void load_weights(const fs::path& path, Gpt& model) {
  SafetensorsFile f = SafetensorsFile::read(path);
  check_config(f, model.config());
  check_tensors(f, model.table(), "");
  copy_tensors(f, model, "", Range{0, model.table().count()}, model.params().data());
}

fs::path save_checkpoint(const fs::path& dir, const Gpt& model, const AdamW& opt, const TrainState& s, int keep) {
  if (opt.owned() != Range{0, model.table().count()}) {
    throw InvalidUsage("saving a sharded optimizer state needs its shards gathered to one rank first");
  }
  const fs::path step_dir = dir / step_dir_name(s.step);
  fs::create_directories(step_dir);
  save_weights(step_dir / kModelFile, model, s.step);
  std::vector<TensorToWrite> tensors = named_tensors(model, "m.", opt.m().data());
  for (auto& t : named_tensors(model, "v.", opt.v().data())) tensors.push_back(std::move(t));
  write_safetensors(step_dir / kOptimizerFile, tensors, config_metadata(model.config(), s.step));
  json state = {{"format", "braid-train-state"},
                {"version", 1},
                {"step", s.step},
                {"options", s.options},
                // Batches are a function of (seed, step, index): the next
                // step and the seed are the whole data position.
                {"data", {{"source", s.data_source}, {"bytes", s.data_bytes},
                          {"fingerprint", s.data_fingerprint}, {"next_step", s.step},
                          {"seed", s.options.value("seed", json())},
                          {"sampler", "offset = hash_words(seed, stream, step, index) mod (bytes - T)"}}}};
  write_file_atomically(step_dir / kStateFile, state.dump(2) + "\n");
  sync_directory(dir);
  write_file_atomically(dir / kLatest, step_dir_name(s.step) + "\n");
  prune(dir, std::max(keep, 1));
  return step_dir;
}

fs::path resolve_checkpoint(const fs::path& path) {
  if (fs::exists(path / kStateFile)) return path;
  std::ifstream in(path / kLatest);
  std::string name;
  if (!in || !(in >> name) || name.find('/') != std::string::npos) {
    throw InvalidUsage(path.string() + " is not a braid-train checkpoint: it has neither " + kStateFile +
                       " nor a readable '" + kLatest + "' file; pass --checkpoint-dir's directory");
  }
  return path / name;
}

TrainState read_train_state(const fs::path& step_dir) {
  const fs::path path = step_dir / kStateFile;
  json j = read_json(path);
  try {
    TrainState s;
    if (j.at("format") != "braid-train-state") throw InvalidUsage("its format is not braid-train-state");
    s.step = j.at("step").get<std::int64_t>();
    s.options = j.at("options");
    s.data_source = j.at("data").at("source").get<std::string>();
    s.data_bytes = j.at("data").at("bytes").get<std::uint64_t>();
    s.data_fingerprint = j.at("data").at("fingerprint").get<std::uint64_t>();
    if (s.step < 0) throw InvalidUsage("its step is negative");
    return s;
  } catch (const std::exception& e) {
    throw InvalidUsage("checkpoint state " + path.string() + " is refused: " + e.what());
  }
}

TrainState load_checkpoint(const fs::path& step_dir, Gpt& model, AdamW& opt) {
  TrainState s = read_train_state(step_dir);
  SafetensorsFile weights = SafetensorsFile::read(step_dir / kModelFile);
  SafetensorsFile moments = SafetensorsFile::read(step_dir / kOptimizerFile);
  for (const SafetensorsFile* f : {&weights, &moments}) {
    check_config(*f, model.config());
    if (metadata_int(*f, "step") != s.step) {
      throw InvalidUsage("checkpoint " + f->path().string() + " is refused: it is from step " +
                         f->metadata_value("step") + " but " + kStateFile + " says step " + std::to_string(s.step));
    }
  }
  check_tensors(weights, model.table(), "");
  check_tensors(moments, model.table(), "m.");
  check_tensors(moments, model.table(), "v.");
  copy_tensors(weights, model, "", Range{0, model.table().count()}, model.params().data());
  copy_tensors(moments, model, "m.", opt.owned(), opt.m().data());
  copy_tensors(moments, model, "v.", opt.owned(), opt.v().data());
  return s;
}

}  // namespace braid::trainer
