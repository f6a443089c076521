#include "trainer/train/options.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>

#include "runtime/errors.h"
#include "trainer/checkpoint/atomic_file.h"
#include "trainer/checkpoint/layout.h"
#include "trainer/data/text_data.h"
#include "trainer/strategy/pp_schedule.h"
#include "trainer/strategy/strategy.h"

namespace braid::trainer {

using nlohmann::json;

namespace {

// A float as the shortest decimal that reads back as the same float, so
// JSON shows "lr": 0.003, not the double 0.003000000026077032.
double shortest(float value) {
  for (int digits = 1; digits < 9; ++digits) {
    char text[32];
    std::snprintf(text, sizeof text, "%.*g", digits, static_cast<double>(value));
    const double parsed = std::strtod(text, nullptr);
    if (static_cast<float>(parsed) == value) return parsed;
  }
  return static_cast<double>(value);
}

}  // namespace

json run_options_json(const TrainOptions& o) {
  return json{{"n_layer", o.model.n_layer},
              {"n_head", o.model.n_head},
              {"n_embd", o.model.n_embd},
              {"block_size", o.model.block_size},
              {"batch_size", o.batch_size},
              {"grad_accum", o.grad_accum},
              {"steps", o.steps},
              {"lr", shortest(o.lr)},
              {"min_lr", shortest(o.min_lr)},
              {"warmup_steps", o.warmup_steps},
              {"weight_decay", shortest(o.weight_decay)},
              {"grad_clip", shortest(o.grad_clip)},
              {"seed", o.seed},
              {"data", o.data},
              {"eval_interval", o.eval_interval},
              {"eval_batches", o.eval_batches},
              {"checkpoint_interval", o.checkpoint_interval},
              {"schedule", o.schedule},
              // ZeRO's partition follows the buckets, and so does the order
              // in which its sums are added: a resume at another size was
              // not bit for bit (found by a review helper).
              {"bucket_mb", o.bucket_mb}};
}

namespace {

// A saved or --config setting of the field's own type: nlohmann's get()
// would turn 2.7 and true into the integer 2 and 1, wrap 2^32 + 2 into an
// int as 2, and read a string only as a string; each is refused instead,
// naming the key, and the field's range only where the value is outside it
// (not for 2.7, which no range would cure), in the words of the flags'.
template <typename T>
void take(const json& saved, const std::set<std::string>& keep, const char* key, T& field) {
  if (!saved.contains(key) || keep.count(key) != 0) return;
  const json& value = saved.at(key);
  auto refuse = [&](const std::string& wanted) {
    throw InvalidUsage(std::string("setting '") + key + "' must be " + wanted + ", not " + value.dump());
  };
  if constexpr (std::is_same_v<T, std::string>) {
    if (!value.is_string()) refuse("a string");
    field = value.get<std::string>();
  } else if constexpr (std::is_integral_v<T>) {
    const std::string range = "a whole number from " + std::to_string(std::numeric_limits<T>::min()) + " to " +
                              std::to_string(std::numeric_limits<T>::max());
    if (value.is_number_unsigned()) {
      const auto v = value.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) refuse(range);
      field = static_cast<T>(v);
    } else if (value.is_number_integer()) {
      const auto v = value.get<std::int64_t>();
      if (std::is_unsigned_v<T> ? v < 0 : v < static_cast<std::int64_t>(std::numeric_limits<T>::min())) refuse(range);
      if (v > 0 && static_cast<std::uint64_t>(v) > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
        refuse(range);
      field = static_cast<T>(v);
    } else {
      refuse("a whole number");
    }
  } else {
    static_assert(std::is_floating_point_v<T>);
    if (!value.is_number()) refuse("a number");
    const double v = value.get<double>();
    if (std::isfinite(v) && std::abs(v) > static_cast<double>(std::numeric_limits<T>::max()))
      refuse("a number within " + std::to_string(std::numeric_limits<T>::max()));
    field = static_cast<T>(v);
  }
}

void require(bool ok, const std::string& message) {
  if (!ok) throw InvalidUsage(message);
}

}  // namespace

void apply_run_options(const json& s, const std::set<std::string>& keep, TrainOptions& o) {
  take(s, keep, "n_layer", o.model.n_layer);
  take(s, keep, "n_head", o.model.n_head);
  take(s, keep, "n_embd", o.model.n_embd);
  take(s, keep, "block_size", o.model.block_size);
  take(s, keep, "batch_size", o.batch_size);
  take(s, keep, "grad_accum", o.grad_accum);
  take(s, keep, "steps", o.steps);
  take(s, keep, "lr", o.lr);
  take(s, keep, "min_lr", o.min_lr);
  take(s, keep, "warmup_steps", o.warmup_steps);
  take(s, keep, "weight_decay", o.weight_decay);
  take(s, keep, "grad_clip", o.grad_clip);
  take(s, keep, "seed", o.seed);
  take(s, keep, "data", o.data);
  take(s, keep, "eval_interval", o.eval_interval);
  take(s, keep, "eval_batches", o.eval_batches);
  take(s, keep, "checkpoint_interval", o.checkpoint_interval);
  take(s, keep, "schedule", o.schedule);
  take(s, keep, "bucket_mb", o.bucket_mb);
}

json config_json(const TrainOptions& o) {
  json j = run_options_json(o);
  j["strategy"] = o.strategy;
  j["dp"] = o.dp;
  j["tp"] = o.tp;
  j["pp"] = o.pp;
  return j;
}

namespace {

std::string key_list(const json& j) {
  std::string names;
  for (const auto& [key, value] : j.items()) names += (names.empty() ? "" : ", ") + key;
  return names;
}

}  // namespace

std::set<std::string> apply_config_file(const std::string& path, const std::set<std::string>& keep,
                                        TrainOptions& o) {
  // A FIFO would be waited on for a writer forever, and a directory read
  // as a stream error: only a file is read.
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode))
    throw InvalidUsage("--config " + path + " is " + file_kind(info.st_mode) + "; name a JSON file");
  std::ifstream in(path);
  require(in.good(), "cannot read the --config file " + path);
  json j;
  // A setting given twice took its last value without a word (a review
  // helper's case): the first repeated key is named instead.
  std::set<std::string> seen;
  std::string repeated;
  const json::parser_callback_t note_repeats = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second &&
        repeated.empty())
      repeated = parsed.get<std::string>();
    return true;
  };
  try {
    j = json::parse(in, note_repeats);
  } catch (const json::exception& e) {
    throw InvalidUsage("--config " + path + " is not valid JSON: " + printable(e.what()));
  }
  require(repeated.empty(), "--config " + path + " gives the setting '" + repeated + "' twice; keep one");
  require(j.is_object(), "--config " + path + " must hold one JSON object of settings");
  const json known = config_json(TrainOptions{});
  std::set<std::string> set;
  for (const auto& [key, value] : j.items()) {
    require(known.contains(key),
            "--config " + path + ": unknown setting '" + key + "' (known: " + key_list(known) + ")");
    if (keep.count(key) == 0) set.insert(key);
  }
  apply_run_options(j, keep, o);
  take(j, keep, "strategy", o.strategy);
  take(j, keep, "dp", o.dp);
  take(j, keep, "tp", o.tp);
  take(j, keep, "pp", o.pp);
  return set;
}

namespace {

// inf and nan parse as floats but cannot train: every real-valued option
// must be a finite number first.
void require_finite(double value, const char* flag) {
  require(std::isfinite(value), std::string(flag) + " must be a finite number (got " + std::to_string(value) + ")");
}

void validate_reals(const TrainOptions& o) {
  require_finite(o.lr, "--lr");
  require_finite(o.min_lr, "--min-lr");
  require_finite(o.weight_decay, "--weight-decay");
  require_finite(o.grad_clip, "--grad-clip");
  require_finite(o.temperature, "--temperature");
  require_finite(o.bucket_mb, "--bucket-mb");
}

void validate_schedule(const TrainOptions& o) {
  validate_reals(o);
  require(o.steps >= 0, "--steps must be 0 or more");
  require(o.lr > 0.0f, "--lr must be positive");
  require(o.min_lr >= 0.0f && o.min_lr <= o.lr,
          "--min-lr " + json(shortest(o.min_lr)).dump() + " must be between 0 and --lr " + json(shortest(o.lr)).dump());
  require(o.warmup_steps >= 0, "--warmup-steps must be 0 or more");
  require(o.weight_decay >= 0.0f, "--weight-decay must be 0 or more");
  require(o.grad_clip >= 0.0f, "--grad-clip must be 0 (off) or more");
  require(o.eval_interval >= 0, "--eval-interval must be 0 (only at the end) or more");
  require(o.eval_batches >= 1, "--eval-batches must be at least 1");
}

void validate_batch(const TrainOptions& o) {
  require(o.batch_size >= 1, "--batch-size must be at least 1 (it is the global batch in sequences)");
  // One option, two names: --micro-batches is the pipeline's word for it.
  require(o.grad_accum >= 1, "--grad-accum (--micro-batches) must be at least 1");
  require(o.batch_size % o.grad_accum == 0,
          "--batch-size " + std::to_string(o.batch_size) + " is not divisible by --grad-accum (--micro-batches) " +
              std::to_string(o.grad_accum) + "; choose a batch that splits into equal micro-batches");
}

// The kernels index activations with int: the largest are [B, NH, T, T]
// and [B, T, 4C], of a rank's micro-batch B and its NH heads (n_head / tp).
// Checked with the global micro-batch and every head, it refused layouts
// whose ranks hold a part of that (a review helper's case).
void validate_shapes(const TrainOptions& o, long long B, long long heads) {
  const long long T = o.model.block_size;
  const long long largest = std::max({B * heads * T * T, B * T * 4 * o.model.n_embd, B * T * 256});
  require(largest < std::numeric_limits<int>::max(),
          "a micro-batch of " + std::to_string(B) + " sequences of " + std::to_string(T) + " tokens" +
              (heads == o.model.n_head ? std::string() : " and " + std::to_string(heads) + " heads") +
              " on a rank is too large; " +
              (B > 1 ? std::string("lower --batch-size or raise --grad-accum, or lower --block-size")
                     : std::string("lower --block-size (or --n-head)")));
}

// More BLAS threads than a few per hardware thread only adds switching;
// far more is a typo that would try to start thousands of threads.
void validate_threads(int threads) {
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int most = kThreadsPerHardwareThread * hardware;
  require(threads >= 1 && threads <= most,
          "--threads " + std::to_string(threads) + " is outside 1.." + std::to_string(most) + " (at most " +
              std::to_string(kThreadsPerHardwareThread) + " x the " + std::to_string(hardware) +
              " hardware threads of this machine)");
}

// The names the saves own at the top of a checkpoint directory (layout.h,
// atomic_file.h): `latest`, the lock file, the step directories and the
// temporary files of an atomic write (".latest.tmp.XXXXXX").
bool owned_by_checkpoints(const std::string& name) {
  return name == layout::kLatest || name == DirectoryLock::path_in("").string() || layout::is_step_name(name) ||
         (name.starts_with(".") && name.find(".tmp.") != std::string::npos);
}

// Whether `dir` is the top of a checkpoint directory: one that holds a
// `latest` or a lock file, or the directory of the run's own
// --checkpoint-dir (not there yet before the first save), of --resume, of
// --consolidate or of --init-from (each possibly named by a step
// directory in it).
bool is_checkpoint_root(const std::filesystem::path& dir, const TrainOptions& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir / layout::kLatest, ec) || fs::exists(DirectoryLock::path_in(dir), ec)) return true;
  auto same = [&](const fs::path& a, const fs::path& b) {
    std::error_code ea, eb;
    const fs::path ca = fs::weakly_canonical(a, ea), cb = fs::weakly_canonical(b, eb);
    return !ea && !eb && ca == cb;
  };
  for (const std::string* root : {&o.checkpoint_dir, &o.resume, &o.consolidate, &o.init_from}) {
    if (root->empty()) continue;
    fs::path named = fs::path(*root).lexically_normal();
    if (!named.has_filename()) named = named.parent_path();  // "ck/step_4/"
    if (same(dir, named)) return true;
    const fs::path up = named.parent_path().empty() ? fs::path(".") : named.parent_path();
    const bool step = fs::exists(named / layout::kStateFile, ec) || fs::exists(named / layout::kManifestFile, ec);
    if (step && same(dir, up)) return true;
  }
  return false;
}

// A file the run writes must not be one it reads, nor a file of a
// checkpoint step: "--consolidate c --out c/step_4/model.safetensors"
// replaced the step's weights, which --resume then refused as written by
// another save, and "--metrics corpus.txt --data corpus.txt" replaced the
// corpus with JSON lines, each without a word (found by a review helper).
void validate_outputs(const TrainOptions& o) {
  namespace fs = std::filesystem;
  const std::pair<const char*, const std::string*> outputs[] = {
      {"--out", &o.out}, {"--init-out", &o.init_out}, {"--metrics", &o.metrics}};
  const std::pair<const char*, const std::string*> inputs[] = {
      {"--data", &o.data}, {"--config", &o.config}, {"--init-from", &o.init_from}};
  for (const auto& [flag, path] : outputs) {
    if (path->empty()) continue;
    for (const auto& [read_flag, read] : inputs) {
      std::error_code ec;  // a file that is not there yet is none of them
      require(read->empty() || !fs::equivalent(*path, *read, ec),
              std::string(flag) + " " + *path + " is the file " + read_flag + " reads; writing it would replace "
                  "it: name another file");
    }
    // Where the file really is: a symlink into a step directory was
    // followed by the write, even one whose target is not there yet (a
    // review helper found both).
    fs::path real = *path;
    for (int links = 0; links < 40; ++links) {
      std::error_code ec;
      if (!fs::is_symlink(real, ec)) break;
      const fs::path target = fs::read_symlink(real, ec);
      if (ec) break;
      real = target.is_absolute() ? target : real.parent_path() / target;
    }
    std::error_code resolved;
    if (const fs::path canonical = fs::weakly_canonical(real, resolved); !resolved) real = canonical;
    const fs::path parent = real.parent_path().empty() ? fs::path(".") : real.parent_path();
    // The default corpus is every file there (text_data.h): --data was
    // compared above, the directory every run without it reads was not, and
    // "--init-out /usr/share/games/fortunes/art" replaced part of it with
    // weights (a review helper's case).
    std::error_code in_corpus;
    require(!fs::equivalent(parent, kDefaultCorpusDir, in_corpus),
            std::string(flag) + " " + *path + " lies in " + kDefaultCorpusDir + ", the default corpus every run "
                "without --data reads: writing there would change it; name a file elsewhere");
    require(!is_checkpoint_root(parent, o) || !owned_by_checkpoints(real.filename().string()),
            std::string(flag) + " " + *path + " is " + real.filename().string() + " of the checkpoint directory " +
                parent.string() + ", a name its saves own (latest, the lock, step_N): writing it would break "
                "that checkpoint for --resume, --consolidate and --init-from; name another file");
    for (const char* marker : {layout::kStateFile, layout::kManifestFile}) {
      std::error_code ec;
      require(!fs::exists(parent / marker, ec),
              std::string(flag) + " " + *path + " lies in the checkpoint step directory " + parent.string() +
                  " (it holds " + marker + "): writing there would replace or add to a file of that step; "
                  "name a file outside it");
    }
    // In a step's directory not complete yet (made by hand, or a save's
    // staging): the save of that step replaces the directory whole.
    require(!layout::is_step_name(parent.filename().string()) || !is_checkpoint_root(parent.parent_path(), o),
            std::string(flag) + " " + *path + " lies in " + parent.string() + ", a step directory of the checkpoint "
                "directory " + parent.parent_path().string() + ", which its save replaces whole; name a file "
                "outside it");
  }
}

// Whether JSON can hold `text` (only UTF-8).
bool json_can_hold(const std::string& text) {
  try {
    (void)json(text).dump();
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

void validate_modes(const TrainOptions& o) {
  // A checkpoint records --data's absolute path in JSON: a path in another
  // encoding trained the whole run, then failed every save with the JSON
  // library's "invalid UTF-8 byte" (found by a review helper).
  if (!o.checkpoint_dir.empty() && !o.data.empty()) {
    const std::string path = std::filesystem::absolute(o.data).string();
    require(json_can_hold(path), "--data " + o.data + ": its path " + path + " is not valid UTF-8, and a checkpoint "
                                 "records it in JSON, which holds only UTF-8; reach the file by a path of UTF-8 "
                                 "names (rename it, or link to it from such a directory)");
  }
  // The run id goes into every step's state.json too.
  require(o.checkpoint_dir.empty() || json_can_hold(o.run_id),
          "the run id '" + o.run_id + "' (BRAID_RUN_ID or TORCHELASTIC_RUN_ID) is not valid UTF-8, and a checkpoint "
          "records it in JSON, which holds only UTF-8; give the job an ASCII run id");
  require(o.resume.empty() || o.init_from.empty(), "--resume and --init-from exclude each other; pass one");
  require(!o.eval_only || !o.init_from.empty() || !o.resume.empty(),
          "--eval-only needs weights: pass --init-from FILE|DIR or --resume DIR");
  require(o.checkpoint_interval >= 0, "--checkpoint-interval must be 0 (only at the end) or more");
  require(o.checkpoint_interval == 0 || !o.checkpoint_dir.empty(),
          "--checkpoint-interval needs --checkpoint-dir");
  validate_threads(o.threads);
  require(o.log_interval >= 0, "--log-interval must be 0 (about 20 lines) or more");
  require(o.sample_bytes >= 0, "--sample must be 0 or more");
  require(o.temperature >= 0.0f, "--temperature must be 0 (greedy) or more");
  require(o.bucket_mb > 0.0 && o.bucket_mb <= 4096.0, "--bucket-mb must be in (0, 4096]");
  if (!o.strategy.empty()) parse_strategy(o.strategy);
  parse_device(o.device);
  require(o.consolidate.empty() == o.out.empty(), "--consolidate DIR and --out FILE go together");
  if (!o.out.empty()) require_file_target(o.out, "--out");
  if (!o.init_out.empty()) require_file_target(o.init_out, "--init-out");
  validate_outputs(o);
  require(o.dp >= 0 && o.tp >= 1 && o.pp >= 1, "--dp must be 0 (world / (tp x pp)) or more, --tp and --pp at least 1");
  parse_pp_schedule(o.schedule);
  require(!o.model_parallel() || (!o.eval_only && o.sample_bytes == 0 && o.init_out.empty()),
          "--eval-only, --sample and --init-out run without --tp / --pp; consolidate a checkpoint "
          "(--consolidate DIR --out FILE) and use the file on one process");
}

}  // namespace

void validate(const TrainOptions& o) {
  validate(o.model);
  validate_schedule(o);
  validate_batch(o);
  validate_modes(o);
}

void validate_world(const TrainOptions& o, int world_size) {
  // One process: "--dp 0 x --tp 2 ..." named a --dp never given.
  const std::int64_t tp_pp = static_cast<std::int64_t>(o.tp) * o.pp;
  require(world_size > 1 || !o.model_parallel(),
          "--tp " + std::to_string(o.tp) + " x --pp " + std::to_string(o.pp) + " needs " +
              std::to_string(tp_pp) + " ranks (or a multiple), and this world has one process; start "
              "braid-train under braid-launch -n " + std::to_string(tp_pp));
  const int D = o.dp_size(world_size);
  const std::string dp = o.dp > 0 ? "--dp " + std::to_string(D) : "dp " + std::to_string(D) + " (world / (tp x pp))";
  require(D >= 1 && D * tp_pp == world_size,
          dp + " x --tp " + std::to_string(o.tp) + " x --pp " + std::to_string(o.pp) + " is not the world of " +
              std::to_string(world_size) + " rank(s); choose axes whose product is " + std::to_string(world_size) +
              (o.dp > 0 ? " (or leave --dp out: world / (tp x pp))" : ""));
  const int split = D * o.grad_accum;
  require(o.batch_size % split == 0,
          "--batch-size " + std::to_string(o.batch_size) + " does not split into " + std::to_string(D) +
              " rank(s) x " + std::to_string(o.grad_accum) + " micro-batch(es) of equal size; use a multiple of " +
              std::to_string(split) + " (the batch is global: every rank trains on batch-size / ranks sequences" +
              std::string(o.model_parallel() ? "; with --tp / --pp the ranks are the dp ranks)" : ")") +
              // Perhaps neither given here: a resumed run takes them from its checkpoint.
              (o.resume.empty() ? "" : "; a resumed run keeps its checkpoint's --batch-size and --micro-batches "
                                       "(--grad-accum) unless they are given"));
  validate_rank_shapes(o, world_size);
}

void validate_rank_shapes(const TrainOptions& o, int world_size) {
  const int D = o.dp_size(world_size);
  const std::int64_t split = static_cast<std::int64_t>(D) * o.grad_accum;
  if (D < 1 || static_cast<std::int64_t>(D) * o.tp * o.pp != world_size || o.batch_size % split != 0) return;
  validate_shapes(o, o.rank_micro_batch(D), (o.model.n_head + o.tp - 1) / o.tp);
}

void validate_data(const TrainOptions& o, std::size_t train_bytes, std::size_t val_bytes) {
  const auto need = static_cast<std::size_t>(o.model.block_size) + 1;
  const std::string source = o.data.empty() ? "the default corpus" : o.data;
  if (o.eval_only) {
    require(train_bytes >= need, source + " has " + std::to_string(train_bytes) +
                                     " bytes; --eval-only needs at least block_size + 1 = " +
                                     std::to_string(need) + " bytes for one window");
    return;
  }
  require(train_bytes >= need && val_bytes >= need,
          source + " splits into " + std::to_string(train_bytes) + " train and " + std::to_string(val_bytes) +
              " val bytes, but each split needs block_size + 1 = " + std::to_string(need) +
              " bytes; lower --block-size or use a larger file");
}

}  // namespace braid::trainer
