// Private to trainer/checkpoint/: the names and the pieces both checkpoint
// layouts share (checkpoint.h: one process; sharded.h: one file per rank).
//
//   DIR/step_00000100/...   one directory per step, complete once it holds
//                           state.json (one process) or manifest.json (sharded)
//   DIR/latest              "step_00000100", replaced last
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/safetensors.h"

namespace braid::trainer::layout {

inline constexpr const char* kLatest = "latest";
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kStateFile = "state.json";
inline constexpr const char* kManifestFile = "manifest.json";

std::string step_dir_name(std::int64_t step);
// A step directory holding a state file: a checkpoint that was completed.
bool is_complete(const std::filesystem::path& step_dir);
// The integer value of a __metadata__ key; InvalidUsage naming the file.
std::int64_t metadata_int(const SafetensorsFile& file, const std::string& key);

// state.json's content; the manifest adds "shards" to it.
nlohmann::json state_json(const TrainState& state);
TrainState parse_state(const nlohmann::json& j, const std::filesystem::path& path);
nlohmann::json read_json(const std::filesystem::path& path);

// After a step's files are durable: fsync DIR, point `latest` at the step,
// then keep only the newest `keep` complete steps (incomplete leftovers
// older than them go too).
void commit_latest(const std::filesystem::path& dir, std::int64_t step, int keep);

}  // namespace braid::trainer::layout
