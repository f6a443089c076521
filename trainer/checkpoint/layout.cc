#include "trainer/checkpoint/layout.h"

#include <random>
#include <fcntl.h>
#include <stdio.h>  // renameat2

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

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
  if (!s.run_id.empty()) j["run_id"] = s.run_id;
  return j;
}

std::string new_save_id() {
  std::random_device random;
  const std::uint64_t id = (std::uint64_t{random()} << 32) | random();
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(id));
  return text;
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
    if (j.contains("run_id")) s.run_id = j.at("run_id").get<std::string>();
    if (s.step < 0) throw InvalidUsage("its step is negative");
    return s;
  } catch (const std::exception& e) {
    throw InvalidUsage("checkpoint state " + path.string() + " is refused: " + e.what());
  }
}

namespace {

constexpr const char* kSealKey = "checksum";
constexpr std::string_view kSealAlgorithm = "xxh3_64:";

// XXH3-64 of the compact dump of `j` less its seal. nlohmann's json keeps
// keys sorted and prints numbers so that they read back to the same value,
// so a parsed file dumps to the very text that was hashed when it was written.
std::string seal_of(json j) {
  j.erase(kSealKey);
  const std::string text = j.dump();
  return std::string(kSealAlgorithm) + xxh3_hex(text.data(), text.size());
}

}  // namespace

std::string sealed_text(json j) {
  j[kSealKey] = seal_of(j);
  return j.dump(2) + "\n";
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw InvalidUsage("cannot open " + path.string() + "; is this a braid-train checkpoint?");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw InvalidUsage("checkpoint state " + path.string() + " is refused: not valid JSON (" + printable(e.what()) + ")");
  }
  if (!j.is_object()) throw InvalidUsage("checkpoint state " + path.string() + " is refused: not a JSON object");
  if (!j.contains(kSealKey)) {
    // A flipped bit in the key's name ("chec{sum") left a file loading
    // unverified, as if its line had been removed on purpose: a value that
    // reads as a checksum under another key is the seal, damaged.
    for (const auto& [key, value] : j.items())
      if (value.is_string() && value.get<std::string>().rfind(kSealAlgorithm, 0) == 0)
        throw InvalidUsage("checkpoint state " + path.string() + " is refused: its checksum is under the key \"" +
                           key + "\", not \"" + kSealKey + "\"; the file is damaged. Restore it or use another "
                           "checkpoint; to load an edit made on purpose, delete that line");
    spdlog::warn("{} carries no checksum (written before braid sealed its state files, or edited); it loads "
                 "unverified", path.string());
    return j;
  }
  const json& recorded = j.at(kSealKey);
  const std::string actual = seal_of(j);
  if (!recorded.is_string() || recorded.get<std::string>() != actual) {
    throw InvalidUsage("checkpoint state " + path.string() + " is refused: its contents do not match its checksum (" +
                       actual + ", recorded " + recorded.dump() +
                       "); the file is damaged or was edited. Restore it or use another checkpoint; to load an "
                       "edit made on purpose, delete its \"" + kSealKey + "\" line");
  }
  return j;
}

namespace {

constexpr std::string_view kStagingSuffix = ".partial";
constexpr std::string_view kReplacedSuffix = ".replaced";
constexpr std::string_view kPrunedSuffix = ".pruned";

// What a name under DIR is: a step directory, a leftover of one (.partial,
// .replaced, .pruned), or nothing of ours.
struct StepEntry {
  enum Kind { kNone, kStep, kLeftover } kind = kNone;
  std::int64_t step = 0;
};

StepEntry classify(std::string_view name) {
  if (name.rfind("step_", 0) != 0) return {};
  name.remove_prefix(5);
  std::int64_t step = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), step);
  if (ec != std::errc() || end == name.data() || step < 0) return {};
  const std::string_view rest(end, static_cast<std::size_t>(name.data() + name.size() - end));
  if (rest.empty()) return {StepEntry::kStep, step};
  if (rest == kStagingSuffix || rest == kReplacedSuffix || rest == kPrunedSuffix)
    return {StepEntry::kLeftover, step};
  return {};
}

fs::path with_suffix(const fs::path& dir, std::int64_t step, std::string_view suffix) {
  return dir / (step_dir_name(step) + std::string(suffix));
}

}  // namespace

bool is_step_name(std::string_view name) { return classify(name).kind != StepEntry::kNone; }

fs::path staging_dir(const fs::path& dir, std::int64_t step) { return with_suffix(dir, step, kStagingSuffix); }

fs::path open_staging(const fs::path& dir, std::int64_t step, bool fresh) {
  const fs::path staging = staging_dir(dir, step);
  if (fresh) fs::remove_all(staging);
  fs::create_directories(staging);
  return staging;
}

void tidy_staging(const fs::path& staging, const std::vector<std::string>& keep) {
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(staging))
    if (std::find(keep.begin(), keep.end(), entry.path().filename().string()) == keep.end())
      stale.push_back(entry.path());
  for (const fs::path& p : stale) fs::remove_all(p);
}

void write_files(const fs::path& staging, const std::map<std::string, std::string>& files) {
  for (const auto& [name, content] : files) {
    if (name.empty() || name.find('/') != std::string::npos || name.front() == '.')
      throw InvalidUsage("a checkpoint's extra file needs a plain name, not '" + name + "'");
    write_file_atomically(staging / name, content);
  }
}

namespace {

// Removes `path` and everything under it, deepest first, each entry
// counted in `progress` as it goes; gives up when `progress` is cancelled.
// Returns why something stayed ("" where nothing did).
std::string remove_tree(const fs::path& path, WriteProgress* progress) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(path, ec);
  if (status.type() == fs::file_type::not_found) return "";
  std::vector<fs::path> entries;  // parents before their children
  if (fs::is_directory(status))
    for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
      entries.push_back(it->path());
  std::string why = ec ? "cannot list " + path.string() + ": " + ec.message() : "";
  entries.insert(entries.begin(), path);
  for (auto e = entries.rbegin(); e != entries.rend(); ++e) {
    if (progress && progress->cancel.load(std::memory_order_relaxed)) return why.empty() ? "given up" : why;
    std::error_code removed;
    fs::remove(*e, removed);
    if (removed && why.empty()) why = "cannot remove " + e->string() + ": " + removed.message();
    if (!removed && progress) progress->removed.fetch_add(1, std::memory_order_relaxed);
  }
  return why;
}

void warn_left(const fs::path& p, const std::string& why) {
  spdlog::warn("checkpoint: {}", DirectoryHold::named(p.string() + " stays (" + why +
                                                      "); the step just saved stands, and the next save tries again"));
}

}  // namespace

void prune_steps(const fs::path& dir, std::int64_t committed, int keep, WriteProgress* progress) {
  std::vector<std::int64_t> older;  // complete steps before `committed`
  std::vector<fs::path> doomed;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const StepEntry e = classify(it->path().filename().string());
    std::error_code kind;
    if (e.kind == StepEntry::kNone || !it->is_directory(kind) || e.step > committed) continue;
    if (e.kind == StepEntry::kLeftover) {
      doomed.push_back(it->path());
    } else if (e.step < committed) {
      // One that cannot be looked into is neither kept as complete nor removed.
      std::error_code state, manifest;
      if (fs::exists(it->path() / kStateFile, state) || fs::exists(it->path() / kManifestFile, manifest))
        older.push_back(e.step);
      else if (!state && !manifest)
        doomed.push_back(it->path());
    }
  }
  if (ec) warn_left(dir, "its steps cannot be listed: " + ec.message());
  std::sort(older.begin(), older.end(), std::greater<>());
  for (std::size_t i = static_cast<std::size_t>(std::max(keep, 1) - 1); i < older.size(); ++i)
    doomed.push_back(dir / step_dir_name(older[i]));
  // A step goes by one rename first, then its files: removed file by file
  // under its own name, a prune killed midway left step_N holding
  // state.json beside half its shards, listed as a step written whole.
  // Its .pruned name is a leftover, removed by the next prune; one that
  // cannot be renamed stays whole.
  for (fs::path p : doomed) {
    if (const StepEntry e = classify(p.filename().string()); e.kind == StepEntry::kStep) {
      const fs::path aside = with_suffix(dir, e.step, kPrunedSuffix);
      // An earlier prune's, killed or refused before it removed it.
      if (std::string why = remove_tree(aside, progress); !why.empty()) {
        warn_left(p, "its older " + aside.filename().string() + " is in the way: " + why);
        continue;
      }
      std::error_code renamed;
      fs::rename(p, aside, renamed);
      if (renamed) {
        warn_left(p, "it cannot be renamed to " + aside.filename().string() + ": " + renamed.message());
        continue;
      }
      p = aside;
    }
    if (std::string why = remove_tree(p, progress); !why.empty()) warn_left(p, why);
  }
}

std::optional<fs::path> enclosing_step(const fs::path& dir) {
  std::error_code ec;
  fs::path real = fs::weakly_canonical(dir, ec);
  if (ec) real = fs::absolute(dir, ec).lexically_normal();
  for (fs::path p = real; !p.empty(); p = p.parent_path()) {
    if (classify(p.filename().string()).kind != StepEntry::kNone &&
        (is_complete(p) || fs::exists(p.parent_path() / kLatest, ec)))
      return p;
    if (p == p.root_path() || p.parent_path() == p) break;
  }
  return std::nullopt;
}

std::optional<fs::path> newest_complete_step(const fs::path& dir) {
  std::optional<std::int64_t> newest;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const StepEntry e = classify(entry.path().filename().string());
    if (e.kind == StepEntry::kStep && (!newest || e.step > *newest) && is_complete(entry.path())) newest = e.step;
  }
  if (!newest) return std::nullopt;
  return dir / step_dir_name(*newest);
}

std::string after_failed_save(const fs::path& dir, std::int64_t step) {
  const fs::path latest = dir / kLatest, target = dir / step_dir_name(step);
  std::string named;
  if (std::ifstream in(latest); in) in >> named;
  const bool named_whole = !named.empty() && named.find('/') == std::string::npos && is_complete(dir / named);
  const std::string says = named.empty() ? latest.string() + " does not exist or names nothing"
                                         : latest.string() + " names " + named;
  if (is_complete(target) && named != target.filename().string())
    return target.filename().string() + " was written whole, but " + says + " (it could not be moved to it): " +
           "resume from " + target.string();
  if (named_whole) return says + ", the last step written whole";
  if (const auto newest = newest_complete_step(dir))
    return says + "; the newest step written whole is " + newest->string();
  return says + ", and no step in " + dir.string() + " was written whole";
}

fs::path publish_step(const fs::path& dir, std::int64_t step, int keep, WriteProgress* progress) {
  const fs::path staging = staging_dir(dir, step), target = dir / step_dir_name(step);
  sync_directory(staging);
  fs::path old;  // where the step's previous directory ends up
  int err = 0;
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0) {
    // the step is new
  } else if ((err = errno) == EEXIST &&
             ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    old = staging;
  } else {
    if (err == EEXIST) err = errno;
    if (err != EINVAL && err != ENOSYS && err != EOPNOTSUPP)
      throw SystemError(errno_message("publishing checkpoint step " + staging.string() + " as " + target.string(),
                                      err));
    // No renameat2 flags on this file system: move the old step aside.
    if (fs::exists(target)) {
      old = with_suffix(dir, step, kReplacedSuffix);
      fs::remove_all(old);
      fs::rename(target, old);
    }
    fs::rename(staging, target);
  }
  sync_directory(dir);
  // A new DIR's own name, too, in the directory that holds it (DIR/..:
  // where DIR is a symbolic link, or /proc/self/fd/N, its target's).
  sync_directory(dir / "..");
  write_file_atomically(dir / kLatest, step_dir_name(step) + "\n");
  // Published: from here on nothing throws (prune_steps), and a failure to
  // remove what the step replaces fails no save.
  if (progress) progress->published.store(true, std::memory_order_relaxed);
  if (!old.empty()) {
    if (std::string why = remove_tree(old, progress); !why.empty()) warn_left(old, why);
  }
  prune_steps(dir, step, keep, progress);
  return target;
}

}  // namespace braid::trainer::layout
