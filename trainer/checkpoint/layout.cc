#include "trainer/checkpoint/layout.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <vector>

#include "runtime/errors.h"
#include "trainer/checkpoint/atomic_file.h"

namespace braid::trainer::layout {

namespace fs = std::filesystem;
using nlohmann::json;

std::string step_dir_name(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

bool is_complete(const fs::path& step_dir) {
  return fs::exists(step_dir / kStateFile) || fs::exists(step_dir / kManifestFile);
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

json state_json(const TrainState& s) {
  json j = {{"format", "braid-train-state"},
          {"version", 1},
          {"step", s.step},
          {"options", s.options},
          // Batches are a function of (seed, step, index): the next step and
          // the seed are the whole data position.
          {"data", {{"source", s.data_source}, {"bytes", s.data_bytes}, {"fingerprint", s.data_fingerprint},
                    {"next_step", s.step}, {"seed", s.options.value("seed", json())},
                    {"sampler", "offset = hash_words(seed, stream, step, index) mod (bytes - T)"}}}};
  const SavedLayout& l = s.layout;
  if (!l.strategy.empty()) j["layout"] = {{"strategy", l.strategy}, {"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}};
  return j;
}

namespace {

// Checkpoints written before the layout was recorded have none.
SavedLayout parse_layout(const json& j) {
  if (!j.contains("layout")) return {};
  const json& l = j.at("layout");
  SavedLayout layout{l.at("strategy").get<std::string>(), l.at("dp").get<int>(), l.at("tp").get<int>(),
                     l.at("pp").get<int>()};
  if (layout.dp < 1 || layout.tp < 1 || layout.pp < 1) throw InvalidUsage("its layout has an axis below 1");
  return layout;
}

}  // namespace

TrainState parse_state(const json& j, const fs::path& path) {
  try {
    TrainState s;
    if (j.at("format") != "braid-train-state") throw InvalidUsage("its format is not braid-train-state");
    s.step = j.at("step").get<std::int64_t>();
    s.options = j.at("options");
    s.data_source = j.at("data").at("source").get<std::string>();
    s.data_bytes = j.at("data").at("bytes").get<std::uint64_t>();
    s.data_fingerprint = j.at("data").at("fingerprint").get<std::uint64_t>();
    s.layout = parse_layout(j);
    if (s.step < 0) throw InvalidUsage("its step is negative");
    return s;
  } catch (const std::exception& e) {
    throw InvalidUsage("checkpoint state " + path.string() + " is refused: " + e.what());
  }
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

namespace {

void prune(const fs::path& dir, int keep) {
  std::vector<fs::path> steps;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step_", 0) == 0) steps.push_back(entry.path());
  }
  std::sort(steps.begin(), steps.end());
  // Walk from the newest: keep `keep` complete steps and anything newer
  // than the oldest of them (a checkpoint still being written).
  int kept = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (kept >= keep) {
      fs::remove_all(*it);
    } else if (is_complete(*it)) {
      ++kept;
    }
  }
}

}  // namespace

void commit_latest(const fs::path& dir, std::int64_t step, int keep) {
  sync_directory(dir);
  write_file_atomically(dir / kLatest, step_dir_name(step) + "\n");
  prune(dir, std::max(keep, 1));
}

}  // namespace braid::trainer::layout
