// What `--resume PATH` restores, and where the resumed run writes.
//
// PATH is a checkpoint directory (it follows `latest`) or one step
// directory in it. The checkpoint's run options (options.h) become the
// defaults of every key not given on the command line.
//
// Layout: the checkpoint records the strategy and dp x tp x pp that wrote
// it. When this run's world has as many ranks as that layout, --tp and
// --pp not given on the command line are taken from it (dp follows:
// world / (tp x pp)), and so is --strategy unless given, provided the
// resulting layout is the saved one (a strategy chosen for one layout can
// be invalid in another: zero2 does not run under --tp). A world of another
// size restores none of them: the defaults of that world apply, and the
// note says why.
//
// Where new checkpoints go: --checkpoint-dir when given, else the directory
// holding the checkpoint resumed from (the one with `latest` and the step
// directories). Never the directory the run was first started with, which
// state.json no longer records: resuming from a copy writes into the copy,
// and pruning deletes only there.
#pragma once

#include <filesystem>
#include <set>
#include <string>

#include "trainer/train/options.h"

namespace braid::trainer {

// Applies the checkpoint `options.resume` names (see above) to `options`,
// except the keys ("n_layer", "strategy", "checkpoint_dir", ...) in
// `given`. Returns one or two lines for rank 0 to print: what is resumed
// (directory, step, strategy, layout) and what this run uses instead, and
// why, where that differs. Throws InvalidUsage naming the path when it is
// not a checkpoint.
std::string apply_resume(const std::set<std::string>& given, int world_size, TrainOptions& options);

// Where a job restarted by its launcher (--max-restarts) goes on from: the
// directory it writes checkpoints to (--checkpoint-dir, else beside the
// --resume checkpoint), when its latest step is this job's own, which the
// run id that every attempt shares tells (TrainState::run_id); a step that
// records none is not. Where the job has no run id, the directory only when
// the job was not started with --resume (as before run ids). `path` empty:
// start as the first attempt did.
//
// A `latest` that cannot be followed (empty, unreadable, naming a step
// that is gone) is passed over for the newest complete step, when that is
// the job's own; `passed_over` then says why. Resolving it failed every
// restart alike, each with the same refusal, until --max-restarts ran out.
struct RestartPoint {
  std::string path;
  std::string passed_over;
};
RestartPoint restart_checkpoint(const TrainOptions& options, const std::string& run_id);

// The directory that holds a step directory (resolve_checkpoint's): where a
// run resumed from it writes new checkpoints unless --checkpoint-dir says.
std::filesystem::path checkpoint_home(const std::filesystem::path& step_dir);

}  // namespace braid::trainer
