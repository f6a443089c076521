#include "trainer/train/resume.h"

#include <filesystem>
#include <vector>

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/layout.h"
#include "trainer/strategy/compose.h"
#include "runtime/errors.h"

namespace braid::trainer {

namespace fs = std::filesystem;

// Where the step lies on disk: through a symlink `best` -> ckpt/step_00000002
// the run wrote into "." (the symlink's directory).
fs::path checkpoint_home(const fs::path& step_dir) {
  fs::path p = step_dir.lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "ckpt/step_00000002/"
  std::error_code ec;
  if (fs::is_symlink(p, ec)) {
    const fs::path target = fs::canonical(p, ec);
    if (!ec) return target.parent_path();
  }
  return p.has_parent_path() ? p.parent_path() : fs::path(".");
}

namespace {

// What this run will use under `o` in a world of `world_size` ranks.
SavedLayout effective_layout(const TrainOptions& o, int world_size) {
  const int dp = o.dp_size(world_size);
  return {strategy_or_default(o.strategy, dp), dp, o.tp, o.pp};
}

// "--strategy and --tp from the command line", or "" when none is given.
std::string given_layout_flags(const std::set<std::string>& given) {
  std::string flags;
  for (const char* key : {"strategy", "dp", "tp", "pp"}) {
    if (given.count(key) != 0) flags += (flags.empty() ? "--" : " and --") + std::string(key);
  }
  return flags.empty() ? flags : flags + " from the command line";
}

// Restores the saved layout as resume.h says; returns why this run's
// layout may differ from it.
std::string restore_layout(const SavedLayout& saved, const std::set<std::string>& given, int world_size,
                           TrainOptions& o) {
  if (saved.strategy.empty()) return "the checkpoint does not record its layout";
  if (saved.world_size() != world_size) {
    return "this run has " + std::to_string(world_size) + " rank(s), the checkpoint's layout " +
           std::to_string(saved.world_size()) + "; the defaults for " + std::to_string(world_size) + " apply";
  }
  const int tp = o.tp, pp = o.pp;
  if (given.count("tp") == 0) o.tp = saved.tp;
  if (given.count("pp") == 0) o.pp = saved.pp;
  // The axes given come first: saved ones that leave them no room in this
  // world are not restored (--dp 2 --tp 2 on 4 ranks beside a saved --pp 2
  // was refused as "--dp 2 x --tp 2 x --pp 2", a --pp never given).
  const int model_ranks = o.tp * o.pp;
  const bool fits = model_ranks > 0 && (given.count("dp") != 0 ? o.dp * model_ranks == world_size
                                                               : world_size % model_ranks == 0);
  // Nor beside a --strategy given that runs on data parallelism alone (dp,
  // zero2, zero3; none runs in a mesh of dp 1, and is refused by name at
  // more): a saved --pp 2 beside --strategy zero3 was refused as "zero3
  // does not run with --pp 2", a --pp never given.
  const bool mesh_strategy = o.strategy == "ddp" || o.strategy == "zero1" || o.strategy == "none";
  const bool leaves_strategy = given.count("strategy") == 0 || mesh_strategy || model_ranks == 1 ||
                               given.count("tp") != 0 || given.count("pp") != 0;
  // A --dp alone that fits neither the saved tp x pp nor the defaults:
  // "this run uses ddp on dp=2 tp=1 pp=1", then "--dp 2 x --tp 1 x --pp 1
  // is not the world", hid the saved axes dropped (a review helper's case).
  if (!fits && saved.tp * saved.pp > 1 && given.count("dp") != 0 && given.count("tp") == 0 &&
      given.count("pp") == 0 && o.dp > 0 &&
      static_cast<long long>(o.dp) * tp * pp != world_size && world_size % o.dp == 0) {
    const int room = world_size / o.dp;
    std::string pass;
    if (saved.tp == room) pass = "--tp " + std::to_string(room);
    if (saved.pp == room) pass += (pass.empty() ? "" : " or ") + ("--pp " + std::to_string(room));
    if (pass.empty()) pass = "--tp and --pp whose product is " + std::to_string(room);
    throw InvalidUsage("--dp " + std::to_string(o.dp) + " leaves tp x pp = " + std::to_string(room) + " of the " +
                       std::to_string(world_size) + " ranks, and the checkpoint was written with tp " +
                       std::to_string(saved.tp) + " x pp " + std::to_string(saved.pp) + ": pass " + pass +
                       " beside it, or leave --dp out to keep the checkpoint's layout");
  }
  if (!fits || !leaves_strategy) {  // bad values given are refused later, naming them
    o.tp = tp;
    o.pp = pp;
  }
  const bool same_axes = o.dp_size(world_size) == saved.dp && o.tp == saved.tp && o.pp == saved.pp;
  if (given.count("strategy") == 0 && same_axes) o.strategy = saved.strategy;
  return given_layout_flags(given);
}

}  // namespace

std::string apply_resume(const std::set<std::string>& given, int world_size, TrainOptions& o) {
  const fs::path step_dir = resolve_checkpoint(o.resume);
  const TrainState state = read_train_state(step_dir);
  // Pinned: the trainer loads this step, not the one `latest` names by
  // then (another run writing into the directory moved it between the
  // options read here and the weights, which then came from another step),
  // and the ranks compare it (shared_settings), since each resolved
  // `latest` on its own.
  o.resume = step_dir.string();
  o.resume_step = state.step;
  apply_run_options(state.options, given, o);
  if (given.count("checkpoint_dir") == 0) o.checkpoint_dir = checkpoint_home(step_dir).string();
  const std::string why = restore_layout(state.layout, given, world_size, o);
  const SavedLayout now = effective_layout(o, world_size);
  const std::string written = state.layout.strategy.empty() ? "an unrecorded layout" : state.layout.describe();
  std::string text = "resume: " + step_dir.string() + ", step " + std::to_string(state.step) + ", written by " +
                     written + "; new checkpoints go to " + o.checkpoint_dir + "\n";
  if (now == state.layout) return text + "resume: this run continues with " + now.describe() + "\n";
  return text + "resume: checkpoint was written by " + written + "; this run uses " + now.describe() + " (" +
         (why.empty() ? "the saved layout does not fit these options" : why) + ")\n";
}

RestartPoint restart_checkpoint(const TrainOptions& o, const std::string& run_id) {
  fs::path dir = o.checkpoint_dir;
  if (dir.empty() && !o.resume.empty()) dir = checkpoint_home(resolve_checkpoint(o.resume));
  if (dir.empty()) return {};
  // A job with a run id owns only the steps that record it: one that
  // records none (a run started without a launcher) is another run's, and a
  // restarted job took it over silently, its options with it.
  auto own = [&](const fs::path& step) {
    const std::string written_by = read_train_state(step).run_id;
    return !run_id.empty() ? written_by == run_id : o.resume.empty();
  };
  // A save that published its step but could not move `latest` to it (a
  // full disk) left a whole step newer than the one `latest` names, or
  // than none: the restart resumes from it, rather than doing its steps
  // again or starting over and replacing it.
  const bool named = fs::exists(dir / "latest");
  const std::optional<fs::path> newest = layout::newest_complete_step(dir);
  if (named) {
    fs::path latest;
    try {
      latest = resolve_checkpoint(dir);
    } catch (const InvalidUsage& e) {
      if (!newest || !own(*newest)) throw;
      return {newest->string(), e.what()};
    }
    // Written after `latest` was last moved: a step an earlier launch of
    // the same run id left above the one this launch went back to is older
    // than that move, and is not taken (a review helper's case).
    std::error_code ec;
    const bool after = newest && fs::last_write_time(*newest, ec) > fs::last_write_time(dir / "latest", ec) && !ec;
    // newest_complete_step is the highest-numbered whole step, so one that
    // is not `latest`'s is newer than it.
    if (newest && *newest != latest && after && own(*newest)) return {newest->string(), {}};
    return {own(latest) ? dir.string() : std::string(), {}};
  }
  return {newest && own(*newest) ? newest->string() : std::string(), {}};
}

}  // namespace braid::trainer
