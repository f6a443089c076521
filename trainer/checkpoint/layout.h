// Private to trainer/checkpoint/: the names and the pieces both checkpoint
// layouts share (checkpoint.h: one process; sharded.h: one file per rank).
//
//   DIR/step_00000100/...         one directory per step, complete once it holds
//                                 state.json (one process) or manifest.json (sharded)
//   DIR/step_00000100.partial/    the same step while it is written
//   DIR/latest                    "step_00000100", replaced last
//
// A step is written in its staging directory and published by a rename, so
// a step directory only ever holds the files of one save: a save that fails
// or dies leaves the step it would replace as it was, and a step saved again
// (a run resumed from an earlier step writes the same numbers) replaces the
// old directory whole, never file by file. The rename swaps the two
// directories atomically (renameat2 RENAME_EXCHANGE) where the file system
// can; elsewhere the old directory is moved aside first, so a crash between
// the two renames leaves DIR/step_N.replaced and no DIR/step_N. A step
// pruned is renamed DIR/step_N.pruned before its files go.
#pragma once

#include <optional>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

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
// Whether `name` is one a save owns in a checkpoint directory: a step's
// directory (step_<N>), or its staging or set-aside copy (step_<N>.partial,
// step_<N>.replaced, step_<N>.pruned).
bool is_step_name(std::string_view name);
// DIR/step_<step>.partial, where a save of `step` writes its files.
std::filesystem::path staging_dir(const std::filesystem::path& dir, std::int64_t step);
// The staging directory, created if need be. A fresh one (the one-process
// save, which has it to itself) also loses whatever an earlier save that
// died left in it.
std::filesystem::path open_staging(const std::filesystem::path& dir, std::int64_t step, bool fresh);
// Removes from `staging` every entry not named in `keep`: what a sharded
// save that died left behind (a stale manifest, another world size's
// shards). Only once every rank of this save has written its files.
void tidy_staging(const std::filesystem::path& staging, const std::vector<std::string>& keep);
// Writes each (name, content) into `staging` atomically.
void write_files(const std::filesystem::path& staging, const std::map<std::string, std::string>& files);
// A step directory holding a state file: a checkpoint that was completed.
bool is_complete(const std::filesystem::path& step_dir);
// The integer value of a __metadata__ key; InvalidUsage naming the file.
std::int64_t metadata_int(const SafetensorsFile& file, const std::string& key);

// state.json's content; the manifest adds "shards" to it.
nlohmann::json state_json(const TrainState& state);
TrainState parse_state(const nlohmann::json& j, const std::filesystem::path& path);
// A state file's text: `j` plus "checksum": "xxh3_64:<16 hex digits>", the
// hash of `j`'s compact dump. read_json refuses a file whose contents no
// longer hash to it (a flipped digit of the learning rate or of the step
// would otherwise resume a different run silently); a file without one (an
// older braid's, or a deliberate edit with the line removed) loads with a
// warning.
std::string sealed_text(nlohmann::json j);

// A random name for one save (16 hex digits): every file of the save
// carries it, so that a file copied in from another save is refused.
std::string new_save_id();
nlohmann::json read_json(const std::filesystem::path& path);

// Once every file in the step's staging directory is durable: rename it to
// DIR/step_<step> (the step's previous directory, if any, goes), fsync DIR,
// point `latest` at the step, then prune (prune_steps). Returns the step's
// directory. A run's saves reach DIR through its hold (through_hold).
// Throws only where the step is not published; once `latest` names it,
// `progress` (if given) is told so (WriteProgress::published) and counts
// what the removal of the older directories takes away, which is best
// effort: a directory that cannot go is named in a warning, the next save
// tries again, and the save stands.
std::filesystem::path publish_step(const std::filesystem::path& dir, std::int64_t step, int keep,
                                   WriteProgress* progress = nullptr);

// Keeps `committed` and the newest keep - 1 complete steps before it, and
// removes the older ones, the incomplete step directories before it and the
// leftovers (.partial, .replaced, .pruned) of steps up to it; a step goes
// by a rename to step_N.pruned first, so a prune killed midway never
// leaves a step directory with some of its files. Steps after `committed`
// are another run's (this one went back to an earlier step) and stay: they
// are not this run's to prune. Best effort: never throws. What cannot be
// removed (a file held open on NFS, another user's, immutable) is named in
// a warning and left for the next prune, and the others go all the same; a
// failed prune once failed the save it followed, and every save after it.
// Each file and directory removed counts in `progress` (if given), which
// can stop it (WriteProgress::cancel).
void prune_steps(const std::filesystem::path& dir, std::int64_t committed, int keep,
                 WriteProgress* progress = nullptr);
// The step directory of a checkpoint that `dir` is or lies in, if any: an
// ancestor (or `dir`) named as a step (step_N, step_N.partial) that holds
// a state file or a manifest, or lies beside a `latest`. Another run's
// pruning removes such a directory with whatever a run wrote into it. (A
// state.json alone is no sign: a project's own files may be named so.)
std::optional<std::filesystem::path> enclosing_step(const std::filesystem::path& dir);
// The newest complete step directory in `dir` (whatever `latest` says), if
// any; for errors about a `latest` that is missing.
std::optional<std::filesystem::path> newest_complete_step(const std::filesystem::path& dir);
// After a save of `step` into `dir` failed: what `dir` now holds, as a
// clause for the error ("<dir>/latest names step_00000002, the last step
// written whole"; or that the step was written whole but `latest` could not
// be moved to it, and where to resume from). A save may fail after it
// published its step (writing `latest` on a full disk).
std::string after_failed_save(const std::filesystem::path& dir, std::int64_t step);

}  // namespace braid::trainer::layout
