// End-to-end runs of the braid-train binary (path in $BRAID_TRAIN, set by
// meson): refusals with exit 2, --eval-only against the reference, resume,
// metrics and sampling.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_fixtures.h"
#include "model_fixtures.h"
#include "reference_gpt.h"
#include "trainer/checkpoint/atomic_file.h"
#include "trainer/checkpoint/checkpoint.h"

namespace braid::trainer {
namespace {

namespace fs = std::filesystem;
using test::braid_train;
using test::have_binary;
using test::read_text;
using test::Run;
using test::write_text;


const std::string kTiny = " --n-layer 1 --n-head 2 --n-embd 16 --block-size 32 --batch-size 4 --eval-batches 1 ";

TEST_CASE("invalid combinations exit 2 before any work, saying what to change", "[cli]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path small = write_text(dir, 100);
  const std::string out = (dir / "init.safetensors").string();
  // --config files whose numbers are not the settings' types: get() made
  // 2.7 and true into n_layer 2 and 1, and wrapped 2^32 + 2 into 2.
  auto config = [&](const std::string& name, const std::string& setting) {
    const fs::path file = dir / name;
    std::ofstream(file) << "{\"n_head\": 2, \"n_embd\": 16, " << setting << "}";
    return "--config " + file.string();
  };
  const fs::path stale = dir / "stale";  // a `latest` whose step is gone
  fs::create_directories(stale);
  std::ofstream(stale / "latest") << "step_00000009\n";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"--seed -1", "--seed: must be a whole number from 0 to 18446744073709551615, not -1"},  // was 2^64 - 1
      // CLI11 saturated a 64-bit value out of range, and read "0x10" and
      // "010" in base 16 and 8.
      {"--seed 18446744073709551616", "--seed: must be a whole number from 0 to 18446744073709551615"},
      {"--steps 99999999999999999999", "--steps: must be a whole number from -9223372036854775808"},
      {"--seed 0x10", "--seed: must be a whole number"},
      {"--batch-size 1e3", "--batch-size: must be a whole number in decimal digits"},
      {"--data ''", "--data is empty"},  // trained on the default corpus
      {"--resume " + stale.string(), "latest names step_00000009, which is not a complete step"},
      // The range only where the value lies outside it (not C's int limits
      // for 2.7).
      {config("float.json", "\"n_layer\": 2.7"), "setting 'n_layer' must be a whole number, not 2.7"},
      {config("bool.json", "\"n_layer\": true"), "setting 'n_layer' must be a whole number, not true"},
      {config("wide.json", "\"n_layer\": 4294967298"),
       "setting 'n_layer' must be a whole number from -2147483648 to 2147483647, not 4294967298"},
      {config("steps.json", "\"n_layer\": 1, \"steps\": 2.9"), "setting 'steps' must be a whole number, not 2.9"},
      {config("lr.json", "\"n_layer\": 1, \"lr\": \"fast\""), "setting 'lr' must be a number"},
      {config("twice.json", "\"n_layer\": 1, \"lr\": 0.1, \"n_layer\": 2"), "gives the setting 'n_layer' twice"},
      {"--checkpoint-dir " + small.string(), "--checkpoint-dir " + small.string() + " cannot hold checkpoints"},
      {"--n-embd 30 --n-head 4", "not divisible by n_head"},
      {"--batch-size 0", "--batch-size must be at least 1"},
      {"--batch-size 6 --grad-accum 4", "not divisible by --grad-accum"},
      {"--data " + small.string() + " --block-size 64", "lower --block-size"},
      {"--data " + (dir / "missing.txt").string(), "does not exist"},
      {"--eval-only", "--eval-only needs weights"},
      {"--resume a --init-from b", "exclude each other"},
      {"--checkpoint-interval 5", "needs --checkpoint-dir"},
      {"--min-lr 1 --lr 0.1", "--min-lr"},
      {"--threads 0", "--threads"},
      {"--n-layer abc", "n-layer"},
      {"--no-such-flag", "no-such-flag"},
      // Ignored without a word before.
      {"--prompt hi", "--prompt shapes the text of --sample N, which is not given"},
      {"--temperature 0.5", "--temperature shapes the text of --sample N"},
      {"--schedule gpipe", "--schedule orders a pipeline's micro-batches; it needs --pp 2 or more"},
      {"--bucket-mb 4", "--bucket-mb sizes the gradient buckets of ddp, zero1 and zero2 on 2 or more DP ranks, and "
                        "this run has one DP rank"},
      {"--strategy ''", "--strategy is empty (an unset shell variable?)"},
      {"--consolidate ck --out w.st --metrics m.jsonl", "--metrics is not used by --consolidate, which writes"},
      {"--consolidate ck --out w.st --sample 10", "--sample is not used by --consolidate"},
      {"--eval-only --init-from w.st --checkpoint-dir ck2 --checkpoint-interval 5",
       "--checkpoint-dir (--out-dir) is not used by --eval-only, which trains no step and saves nothing"},
  };
  for (const Case& c : cases) {
    INFO("braid-train " << c.args);
    const Run r = braid_train(dir, c.args + " --init-out " + out);
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Catch::Contains(c.message));
    CHECK_THAT(r.err, !Catch::Contains("goes unnoticed"));  // a lock warning before the reason
    CHECK_FALSE(fs::exists(out));
  }
  const Run mesh = braid_train(dir, "--tp 2 --steps 1");  // was "--dp 0 x --tp 2 ...", a --dp never given
  CHECK(mesh.rc == 2);
  CHECK_THAT(mesh.err, Catch::Contains("this world has one process; start braid-train under braid-launch -n 2"));
}

// A run resumed from a checkpoint on a read-only file system (it writes
// beside it unless given --checkpoint-dir) is refused before training, and
// the refusal comes alone: it came after a warning that the directory's
// lock file could not be made, which is no matter then (helper-129). The
// file system is a read-only bind mount in a mount namespace of the run's
// own (unshare(1); skipped where that is not allowed).
TEST_CASE("resuming from a read-only checkpoint directory is refused with no lock warning before it", "[cli]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const fs::path ck = dir / "ck";
  const std::string base = kTiny + "--data " + text.string();
  REQUIRE(braid_train(dir, base + " --steps 2 --checkpoint-interval 2 --checkpoint-dir " + ck.string()).rc == 0);
  const std::string read_only = "unshare -m sh -c 'mount --bind " + ck.string() + " " + ck.string() +
                                " && mount -o remount,bind,ro " + ck.string() + " " + ck.string() + " || exit 77; exec " +
                                std::getenv("BRAID_TRAIN") + base + " --steps 4 --resume " + ck.string() + "'";
  const Run r = run_shell(dir, read_only);
  if (r.rc == 77) {
    WARN("skipped: no read-only bind mount in a mount namespace here (needs root): " << r.err);
    return;
  }
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK_THAT(r.err, Catch::Contains(ck.string() + ", where it writes its own unless given --checkpoint-dir, cannot "
                                                  "hold checkpoints: Read-only file system"));
  CHECK_THAT(r.err, !Catch::Contains(".braid-train.lock"));
  CHECK(read_text(ck / "latest") == "step_00000002\n");
}

// A FIFO given as --init-from or --config was waited on for a writer
// forever, on every rank, past BRAID_TIMEOUT; /dev/zero was "Inappropriate
// ioctl for device". An output that is an input or a file of a checkpoint
// step replaced it without a word: the step could no longer be resumed,
// the corpus became JSON lines (found by a review helper).
TEST_CASE("inputs that are not files and outputs that would replace an input are refused", "[cli]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const fs::path fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const fs::path ckpt = dir / "ckpt";
  REQUIRE(braid_train(dir, kTiny + "--data " + text.string() + " --steps 2 --checkpoint-dir " + ckpt.string()).rc == 0);
  const fs::path step = ckpt / "step_00000002";
  const std::string weights = read_text(step / "model.safetensors");
  fs::create_symlink(step / "model.safetensors", dir / "link.jsonl");
  fs::create_symlink(step / "new.jsonl", dir / "dangling.jsonl");  // a file the write would create there
  const std::string corpus = read_text(text);
  struct Case {
    std::string args, message;
  };
  std::vector<Case> cases = {
      {kTiny + "--steps 1 --init-from " + fifo.string(), "checkpoint " + fifo.string() + " is a FIFO, not a file"},
      {kTiny + "--steps 1 --config " + fifo.string(), "--config " + fifo.string() + " is a FIFO"},
      {kTiny + "--steps 1 --config " + dir.path().string(), "is a directory; name a JSON file"},
      {kTiny + "--steps 1 --init-from /dev/zero", "checkpoint /dev/zero is a character device, not a file"},
      {"--consolidate " + ckpt.string() + " --out " + (step / "model.safetensors").string(),
       "--out " + (step / "model.safetensors").string() + " lies in the checkpoint step directory"},
      {kTiny + "--steps 1 --init-out " + (step / "optimizer.safetensors").string(), "lies in the checkpoint step"},
      {kTiny + "--steps 1 --data " + text.string() + " --metrics " + text.string(),
       "--metrics " + text.string() + " is the file --data reads"},
      // A link into a step directory: the write followed it.
      {kTiny + "--steps 1 --metrics " + (dir / "link.jsonl").string(), "lies in the checkpoint step directory"},
      {kTiny + "--steps 1 --metrics " + (dir / "dangling.jsonl").string(), "lies in the checkpoint step directory"},
      // A --checkpoint-dir in a step, or named as one beside `latest`: the
      // other run's next prune removed it with every step written there.
      {kTiny + "--data " + text.string() + " --steps 1 --checkpoint-dir " + step.string(),
       "--checkpoint-dir " + step.string() + " lies in the checkpoint step directory"},
      {kTiny + "--data " + text.string() + " --steps 1 --checkpoint-dir " + (step / "run2").string(),
       "lies in the checkpoint step directory " + step.string()},
      {kTiny + "--data " + text.string() + " --steps 1 --checkpoint-dir " + (ckpt / "step_00000009").string(),
       "lies in the checkpoint step directory"},
      // The names a checkpoint directory's saves own: `latest` replaced by
      // weights left the checkpoint unusable ("ck/latest does not name a
      // step"), and so did the lock file; the run's own --checkpoint-dir
      // replaced a --metrics file there at its first save.
      {"--consolidate " + ckpt.string() + " --out " + (ckpt / "latest").string(),
       "is latest of the checkpoint directory " + ckpt.string()},
      {"--consolidate " + step.string() + " --out " + (ckpt / ".braid-train.lock").string(),
       "is .braid-train.lock of the checkpoint directory"},
      {kTiny + "--data " + text.string() + " --steps 1 --init-from " + ckpt.string() + " --init-out " +
           (ckpt / "latest").string(),
       "is latest of the checkpoint directory"},
      {kTiny + "--data " + text.string() + " --steps 1 --checkpoint-dir " + (dir / "ck2").string() + " --metrics " +
           (dir / "ck2" / "step_00000001").string(),
       "is step_00000001 of the checkpoint directory"},
      // In a step directory made ahead of the save that replaces it.
      {kTiny + "--data " + text.string() + " --steps 1 --checkpoint-dir " + (dir / "ck4").string() + " --metrics " +
           (dir / "ck4" / "step_00000001" / "m.jsonl").string(),
       "a step directory of the checkpoint directory"},
  };
  fs::create_directories(dir / "ck4" / "step_00000001");
  // The default corpus's directory, every run without --data reads: weights
  // written over one of its files changed it (a review helper's case). A
  // name no file there has, so that a check that failed adds a file the
  // corpus skips (it has an extension) and replaces none; through a link too.
  const fs::path corpus_file = fs::path(kDefaultCorpusDir) / "braid-test-output.jsonl";
  fs::create_symlink(corpus_file, dir / "to-corpus.jsonl");
  if (fs::is_directory(kDefaultCorpusDir)) {
    cases.push_back({kTiny + "--steps 1 --metrics " + corpus_file.string(),
                     "lies in /usr/share/games/fortunes, the default corpus every run without --data reads"});
    cases.push_back({kTiny + "--steps 1 --data " + text.string() + " --init-out " + (dir / "to-corpus.jsonl").string(),
                     "lies in /usr/share/games/fortunes, the default corpus"});
  }
  for (const Case& c : cases) {
    INFO("braid-train " << c.args);
    const Run r = test::run_shell(dir, "timeout 30 " + std::string(std::getenv("BRAID_TRAIN")) + " " + c.args);
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Catch::Contains(c.message));
  }
  CHECK(read_text(step / "model.safetensors") == weights);
  CHECK_FALSE(fs::exists(step / "new.jsonl"));
  CHECK_FALSE(fs::exists(step / "run2"));
  CHECK_FALSE(fs::exists(ckpt / "step_00000009"));
  CHECK_FALSE(fs::exists(step / ".braid-train.lock"));
  CHECK(read_text(ckpt / "latest") == "step_00000002\n");
  CHECK_FALSE(fs::exists(dir / "ck2" / "step_00000001"));
  CHECK_FALSE(fs::exists(corpus_file));
  std::error_code ignored;
  fs::remove(corpus_file, ignored);
  // A file of another name beside the steps is the user's (nanoGPT keeps
  // its logs in out_dir).
  CHECK(braid_train(dir, kTiny + "--data " + text.string() + " --steps 1 --checkpoint-dir " + (dir / "ck3").string() +
                             " --metrics " + (dir / "ck3" / "step_times.jsonl").string()).rc == 0);
  CHECK(fs::exists(dir / "ck3" / "step_times.jsonl"));
  CHECK(braid_train(dir, "--consolidate " + ckpt.string() + " --out " + (ckpt / "step_final.safetensors").string())
            .rc == 0);
  // A project's own state.json beside a --checkpoint-dir is no checkpoint step.
  fs::create_directories(dir / "project");
  std::ofstream(dir / "project" / "state.json") << "{}\n";
  CHECK(braid_train(dir, kTiny + "--data " + text.string() + " --steps 1 --checkpoint-dir " +
                             (dir / "project" / "ck").string()).rc == 0);
  CHECK(read_text(text) == corpus);
  CHECK(braid_train(dir, "--resume " + ckpt.string() + " --steps 3").rc == 0);
}

// The logging set-up read BRAID_* before any error was caught: a bad value
// aborted braid-train (134, a core dump) even for --help, where it ran
// without braid-launch (torchrun, srun, one process).
TEST_CASE("a bad BRAID_* variable is an invalid usage of braid-train, named", "[cli]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const std::string bin = std::getenv("BRAID_TRAIN");
  for (const std::string env : {"BRAID_LOG_LEVEL=INFO", "BRAID_TIMEOUT=abc"}) {
    INFO(env);
    const Run r = test::run_shell(dir, env + " " + bin + " --help");
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Catch::Contains("braid-train: error: environment variable " + env.substr(0, env.find('='))));
  }
}

// "--steps 010" trained 8 steps (CLI11 read it in octal), and a --lr below
// the default end of the decay (3e-4) was refused over --min-lr, a flag
// never given: the decay now ends at a tenth of such a --lr.
TEST_CASE("integer flags are decimal, and a small --lr alone trains", "[cli]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 1000);
  const fs::path metrics = dir / "metrics.jsonl";
  const Run r = braid_train(dir, kTiny + "--steps 010 --warmup-steps 0 --lr 1e-4 --eval-interval 0 --data " +
                                     text.string() + " --metrics " + metrics.string());
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  std::ifstream in(metrics);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 10);
  CHECK(nlohmann::json::parse(lines.back()).at("step") == 10);
  const double last_lr = nlohmann::json::parse(lines.back()).at("lr").get<double>();
  CHECK(last_lr < 1e-4);
  CHECK(last_lr >= 0.99e-5);  // the decay ends at a tenth of --lr
}

double eval_loss(const std::string& out) {
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex("eval_loss: (\\S+)")));
  return std::stod(m[1]);
}

TEST_CASE("--eval-only prints the mean loss over every window", "[cli]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 1000);
  const std::string ckpt = (dir / "ckpt").string();
  REQUIRE(braid_train(dir, kTiny + "--steps 10 --warmup-steps 0 --lr 0.01 --data " + text.string() + " --checkpoint-dir " + ckpt).rc == 0);
  const fs::path weights = fs::path(ckpt) / "step_00000010" / "model.safetensors";
  const Run r = braid_train(dir, "--eval-only --batch-size 8 --init-from " + weights.string() + " --data " + text.string());
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("31 windows"));  // floor((1000 - 1) / 32)

  // The same windows through the double-precision reference.
  const GptConfig c = read_weights_config(weights);
  Gpt model(c, ModelLayout::whole(c), nullptr);
  load_weights(weights, model);
  const std::vector<double> p(model.params().data(), model.params().data() + model.params().count());
  const std::string bytes = read_text(text);
  double sum = 0;
  for (int i = 0; i < 31; ++i) {
    std::vector<std::int32_t> in(32), tg(32);
    for (int t = 0; t < 32; ++t) {
      in[t] = static_cast<unsigned char>(bytes[i * 32 + t]);
      tg[t] = static_cast<unsigned char>(bytes[i * 32 + t + 1]);
    }
    sum += test::reference_loss(c, model.table(), p, in, tg, 1, 32);
  }
  const double reference = sum / 31;
  CHECK(eval_loss(r.out) == Approx(reference).epsilon(1e-5));
  CHECK(reference < 5.0);  // trained: not the uniform ln(256)

  // --sample with --eval-only was left out without a word, and so was
  // --metrics (no file); the sample is the weights' text as a training
  // run's end prints it, and --metrics is refused.
  const std::string eval = "--eval-only --batch-size 8 --init-from " + weights.string() + " --data " + text.string();
  const Run sampled = braid_train(dir, eval + " --sample 20 --prompt braid");
  REQUIRE(sampled.rc == 0);
  CHECK_THAT(sampled.out, Catch::Contains("eval_loss") && Catch::Contains("--- sample (20 bytes"));
  const Run metrics = braid_train(dir, eval + " --metrics " + (dir / "m.jsonl").string());
  CHECK(metrics.rc == 2);
  CHECK_THAT(metrics.err, Catch::Contains("--metrics records training steps, and --eval-only trains none"));
  CHECK_FALSE(fs::exists(dir / "m.jsonl"));
  // The optimizer's and the schedule's flags ran and exited 0, the same
  // loss printed (a review helper's case), and a strategy without a
  // launcher was told to start without braid-launch.
  for (const std::string flag : {"--steps 9", "--lr 5", "--eval-batches 2", "--warmup-steps 3", "--bucket-mb 1"}) {
    const Run ignored = braid_train(dir, eval + " " + flag);
    INFO(flag);
    CHECK(ignored.rc == 2);
    CHECK_THAT(ignored.err, Catch::Contains(flag.substr(0, flag.find(' ')) + " is not used by --eval-only"));
  }
  const Run ddp = braid_train(dir, eval + " --strategy ddp");
  CHECK(ddp.rc == 2);
  CHECK_THAT(ddp.err, Catch::Contains("strategy ddp: leave --strategy out") && !Catch::Contains("braid-launch"));
}

// Every flag but --out was taken and ignored, a model's size or another
// checkpoint to start from among them (a review helper's case).
TEST_CASE("--consolidate refuses every flag it does not use", "[cli]") {
  if (!have_binary()) return;
  test::TempDir dir;
  for (const std::string flag : {"--n-layer 3", "--init-from b", "--resume b", "--steps 3", "--seed 9", "--tp 2",
                                 "--data x.txt", "--strategy zero3", "--threads 2"}) {
    const Run r = braid_train(dir, "--consolidate ck --out w.st " + flag);
    INFO(flag);
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Catch::Contains(flag.substr(0, flag.find(' ')) + " is not used by --consolidate"));
  }
  const Run missing = braid_train(dir, "--consolidate " + (dir / "no-such").string() + " --out w.st");
  CHECK(missing.rc == 2);
  CHECK_THAT(missing.err, Catch::Contains("no-such does not exist") && !Catch::Contains("not a braid-train"));
  CHECK_FALSE(fs::exists(dir / "w.st"));
}

std::vector<nlohmann::json> metrics_lines(const fs::path& p) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST_CASE("a run resumed from its checkpoint repeats the uninterrupted run exactly", "[cli][resume]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const std::string common = kTiny + "--data " + text.string() + " --steps 4 --lr 0.01 --seed 3 ";
  const std::string ckpt = (dir / "ckpt").string();
  REQUIRE(braid_train(dir, common + "--metrics " + (dir / "a.jsonl").string()).rc == 0);
  REQUIRE(braid_train(dir, common + "--checkpoint-dir " + ckpt + " --checkpoint-interval 2").rc == 0);
  // Resume from step 2: the saved options are the defaults, so no sizes needed.
  const Run r = braid_train(dir, "--resume " + ckpt + "/step_00000002 --metrics " + (dir / "b.jsonl").string());
  REQUIRE(r.rc == 0);
  const auto a = metrics_lines(dir / "a.jsonl"), b = metrics_lines(dir / "b.jsonl");
  REQUIRE(a.size() == 4);
  REQUIRE(b.size() == 2);
  for (int i = 0; i < 2; ++i) {
    CHECK(b[i]["step"] == a[i + 2]["step"]);
    CHECK(b[i]["loss"].get<double>() == a[i + 2]["loss"].get<double>());
    CHECK(b[i]["grad_norm"].get<double>() == a[i + 2]["grad_norm"].get<double>());
  }
  for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "bytes_sent",
                          "bytes_received", "peak_memory_bytes"}) {
    CHECK(a[0].contains(key));
  }
  CHECK(a[0]["peak_memory_bytes"]["optimizer_state"] == 2 * a[0]["peak_memory_bytes"]["parameters"].get<long>());
  CHECK(a[3].contains("val_loss"));
}

// A restarted job resumes with the command line it had, --metrics included:
// the file keeps the steps up to the checkpoint (it lost only the later
// ones, which the run trains again) and holds every step once.
TEST_CASE("a run resumed with the same --metrics file keeps its steps up to the checkpoint; one resumed past "
          "--steps says it trains nothing", "[cli][resume]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const std::string common = kTiny + "--data " + text.string() + " --steps 4 --lr 0.01 --seed 3 ";
  const std::string ckpt = (dir / "ckpt").string(), metrics = (dir / "m.jsonl").string();
  REQUIRE(braid_train(dir, common + "--checkpoint-dir " + ckpt + " --checkpoint-interval 2 --metrics " + metrics)
              .rc == 0);
  const auto first = metrics_lines(metrics);
  REQUIRE(first.size() == 4);
  // As an earlier attempt on two ranks would have left it: resumed on one,
  // the run trims rank 1's file as its own (it kept steps 3 and 4, which
  // the run trains again).
  fs::copy_file(metrics, metrics + ".rank1");
  const Run r = braid_train(dir, "--resume " + ckpt + "/step_00000002 --metrics " + metrics);
  REQUIRE(r.rc == 0);
  const auto after = metrics_lines(metrics);
  REQUIRE(after.size() == 4);
  CHECK(metrics_lines(metrics + ".rank1").size() == 2);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(after[i]["step"] == i + 1);
    CHECK(after[i]["loss"].get<double>() == first[i]["loss"].get<double>());
  }
  CHECK(after[0]["time"] == first[0]["time"]);  // kept, not written again
  // A fresh run starts every file afresh: the one it has no rank for goes.
  REQUIRE(braid_train(dir, common + "--metrics " + metrics).rc == 0);
  CHECK_FALSE(fs::exists(metrics + ".rank1"));
  // Resumed past its --steps, the run trains nothing and says so.
  const Run none = braid_train(dir, "--resume " + ckpt + "/step_00000004 --steps 3");
  CHECK(none.rc == 0);
  CHECK_THAT(none.err, Catch::Contains("nothing to train: the run starts at step 4 (its checkpoint's) and --steps is 3"));
}

TEST_CASE("a corrupt checkpoint is refused by the CLI and left as it was", "[cli]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 2000);
  const std::string ckpt = (dir / "ckpt").string();
  REQUIRE(braid_train(dir, kTiny + "--steps 1 --data " + text.string() + " --checkpoint-dir " + ckpt).rc == 0);
  const fs::path model = fs::path(ckpt) / "step_00000001" / "model.safetensors";
  fs::resize_file(model, fs::file_size(model) - 8);
  const std::string before = read_text(model);
  std::ofstream(dir / "keep.safetensors") << "precious";

  const Run resumed = braid_train(dir, "--resume " + ckpt + " --steps 2 --checkpoint-dir " + ckpt);
  CHECK(resumed.rc == 2);
  CHECK_THAT(resumed.err, Catch::Contains(model.string()) && Catch::Contains("out of range"));
  const Run init = braid_train(dir, "--init-from " + model.string() + " --init-out " + (dir / "keep.safetensors").string());
  CHECK(init.rc == 2);
  CHECK(read_text(model) == before);
  CHECK(read_text(dir / "keep.safetensors") == "precious");
  CHECK_FALSE(fs::exists(fs::path(ckpt) / "step_00000002"));
}

// A full disk, played by a file-size limit (writes past it fail with EFBIG;
// SIGXFSZ ignored): the save fails the run with the file and the cause, no
// half-written step stays, `latest` still names the last complete
// checkpoint, and resuming from it works once there is room.
TEST_CASE("a checkpoint that cannot be written fails the run and loses nothing", "[cli][checkpoint]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const std::string ckpt = (dir / "ckpt").string();
  const std::string common =
      kTiny + "--data " + text.string() + " --checkpoint-dir " + ckpt + " --checkpoint-interval 2 ";
  REQUIRE(braid_train(dir, common + "--steps 2").rc == 0);
  const std::string latest = read_text(fs::path(ckpt) / "latest");
  const std::string err = (dir / "full.err").string();
  const std::string limited = "trap '' XFSZ; ulimit -f 8; exec " + std::string(std::getenv("BRAID_TRAIN")) + " " +
                              common + "--steps 4 --resume " + ckpt + " > /dev/null 2> " + err;
  const int status = std::system(("bash -c \"" + limited + "\"").c_str());
  const std::string message = read_text(err);
  INFO(message);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 1));
  CHECK_THAT(message, Catch::Contains("step_00000004") && Catch::Contains("File too large"));
  CHECK(read_text(fs::path(ckpt) / "latest") == latest);
  CHECK_FALSE(fs::exists(fs::path(ckpt) / "step_00000004"));
  const Run resumed = braid_train(dir, common + "--steps 4 --resume " + ckpt);
  CHECK(resumed.rc == 0);
  CHECK(fs::exists(fs::path(ckpt) / "step_00000004" / "model.safetensors"));
}

// A run killed while it wrote `latest` left `.latest.tmp.XXXXXX`, which no
// later save removed: the run that takes the directory does.
TEST_CASE("the run that takes a checkpoint directory removes the temporary files of killed writes", "[cli][checkpoint]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const fs::path ckpt = dir / "ckpt";
  const std::string common = kTiny + "--data " + text.string() + " --checkpoint-dir " + ckpt.string() + " ";
  REQUIRE(braid_train(dir, common + "--steps 2").rc == 0);
  for (const char* name : {".latest.tmp.Ab12Cd", ".shard_00000_of_00002.safetensors.tmp.x9Y8z7", ".keep", "a.tmp.Ab12Cd"})
    std::ofstream(ckpt / name) << "left";
  REQUIRE(braid_train(dir, common + "--steps 3 --resume " + ckpt.string()).rc == 0);
  CHECK_FALSE(fs::exists(ckpt / ".latest.tmp.Ab12Cd"));
  CHECK_FALSE(fs::exists(ckpt / ".shard_00000_of_00002.safetensors.tmp.x9Y8z7"));
  CHECK(fs::exists(ckpt / ".keep"));
  CHECK(fs::exists(ckpt / "a.tmp.Ab12Cd"));
}

// A fresh run into a --checkpoint-dir that holds an earlier run's steps
// replaced the steps of the same numbers and pruned the others (a model of
// another shape among them), so it is refused; --resume continues it.
TEST_CASE("a fresh run into an earlier run's --checkpoint-dir is refused and changes nothing", "[cli][checkpoint]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const std::string ckpt = (dir / "ckpt").string();
  const std::string common = kTiny + "--data " + text.string() + " --checkpoint-dir " + ckpt + " --checkpoint-interval 2 ";
  REQUIRE(braid_train(dir, common + "--steps 4").rc == 0);
  const std::string latest = read_text(fs::path(ckpt) / "latest");
  const Run again = braid_train(dir, common + "--steps 4 --seed 5");
  CHECK(again.rc == 2);
  CHECK_THAT(again.err, Catch::Contains("holds the checkpoints of an earlier run: continue it with --resume"));
  CHECK(read_text(fs::path(ckpt) / "latest") == latest);
  CHECK(fs::exists(fs::path(ckpt) / "step_00000002"));
  CHECK(braid_train(dir, common + "--steps 6 --resume " + ckpt).rc == 0);
}

// A first save that published its step but could not write `latest` (a
// disk that filled up just then; here `latest` removed) left a whole step
// that a fresh run replaced with its own, with other settings, without a
// word (found by a review helper on a small tmpfs). It is refused as a
// directory with `latest` is, naming the step to resume from.
TEST_CASE("a fresh run into a --checkpoint-dir with a complete step but no latest is refused", "[cli][checkpoint]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const fs::path ckpt = dir / "ckpt", step = ckpt / "step_00000002";
  const std::string common = kTiny + "--data " + text.string() + " --checkpoint-dir " + ckpt.string() + " ";
  REQUIRE(braid_train(dir, common + "--steps 2").rc == 0);
  fs::remove(ckpt / "latest");
  const std::string weights = read_text(step / "model.safetensors");
  const Run again = braid_train(dir, common + "--steps 2 --seed 7 --lr 0.01");
  CHECK(again.rc == 2);
  CHECK_THAT(again.err, Catch::Contains("holds the complete step step_00000002 of an earlier run, though no 'latest' "
                                        "names it") &&
                            Catch::Contains("continue that run with --resume " + step.string()));
  CHECK(read_text(step / "model.safetensors") == weights);
  CHECK(braid_train(dir, common + "--steps 3 --resume " + step.string()).rc == 0);
  CHECK(read_text(ckpt / "latest") == "step_00000003\n");
}

// Two runs started together on one --checkpoint-dir both found it empty,
// staged their steps in one place and published one step holding shards of
// both, which then loaded without a word. The first run now holds the
// directory (here the test process holds it, as a live run would); another
// run is refused, naming the holder, and runs once it is let go.
// "writing the metrics file ... failed" did not say why; an empty `latest`
// was called unreadable.
// A metrics file whose disk is full ended the run, losing the training
// since the last checkpoint (found by a review helper): the metrics stop,
// loudly, and the run trains on and saves.
TEST_CASE("a metrics file that cannot be written stops the metrics, not the run; an empty latest is refused",
          "[cli][checkpoint]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const Run full = braid_train(dir, kTiny + "--data " + text.string() + " --steps 3 --metrics /dev/full "
                                    "--checkpoint-dir " + (dir / "saved").string());
  CHECK(full.rc == 0);
  CHECK_THAT(full.err, Catch::Contains("writing the metrics file /dev/full failed: No space left on device; the "
                                       "metrics of step 1 and later are not recorded, and training goes on"));
  CHECK(fs::exists(dir / "saved" / "step_00000003"));
  const fs::path ckpt = dir / "ckpt";
  REQUIRE(braid_train(dir, kTiny + "--data " + text.string() + " --steps 2 --checkpoint-dir " + ckpt.string()).rc == 0);
  std::ofstream(ckpt / "latest", std::ios::trunc).flush();
  const Run empty = braid_train(dir, "--resume " + ckpt.string() + " --steps 4");
  CHECK(empty.rc == 2);
  CHECK_THAT(empty.err, Catch::Contains(ckpt.string() + "/latest does not name a step (it is empty)"));
}

TEST_CASE("a run into a --checkpoint-dir that a live run holds is refused, naming the holder", "[cli][checkpoint]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const fs::path ckpt = dir / "ckpt";
  const std::string args = kTiny + "--data " + text.string() + " --checkpoint-dir " + ckpt.string() + " --steps 2";
  {
    auto held = DirectoryLock::take(ckpt, "the test, pid " + std::to_string(::getpid()));
    REQUIRE(held != nullptr);
    CHECK_THROWS_WITH(DirectoryLock::take(ckpt, "a second taker"),
                      Catch::Contains("is in use by another run (the test, pid"));
    const Run refused = braid_train(dir, args);
    INFO(refused.err);
    CHECK(refused.rc == 2);
    CHECK_THAT(refused.err, Catch::Contains("--checkpoint-dir " + ckpt.string() + " is in use by another run (the "
                                            "test, pid " + std::to_string(::getpid()) + ")"));
    CHECK_FALSE(fs::exists(ckpt / "latest"));
  }
  const Run after = braid_train(dir, args);
  INFO(after.err);
  REQUIRE(after.rc == 0);
  const std::string latest = read_text(ckpt / "latest");
  auto held = DirectoryLock::take(ckpt, "the test again");
  const Run resumed = braid_train(dir, "--resume " + ckpt.string() + " --steps 4");
  CHECK(resumed.rc == 2);
  CHECK_THAT(resumed.err, Catch::Contains("is in use by another run (the test again)"));
  CHECK(read_text(ckpt / "latest") == latest);
}

// --resume A --checkpoint-dir B wrote into B over another run's
// checkpoints, which a fresh run into B is refused for: steps of the same
// numbers replaced, the others pruned.
TEST_CASE("a resumed run is refused a --checkpoint-dir holding another run's checkpoints", "[cli][checkpoint]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const std::string common = kTiny + "--data " + text.string() + " ";
  const fs::path other = dir / "other", mine = dir / "mine", fresh = dir / "fresh";
  REQUIRE(braid_train(dir, common + "--steps 4 --checkpoint-interval 2 --seed 7 --checkpoint-dir " + other.string())
              .rc == 0);
  REQUIRE(braid_train(dir, common + "--steps 2 --checkpoint-dir " + mine.string()).rc == 0);
  const std::string latest = read_text(other / "latest");
  const Run refused = braid_train(dir, "--resume " + mine.string() + " --steps 8 --checkpoint-interval 1 "
                                       "--checkpoint-dir " + other.string());
  INFO(refused.err);
  CHECK(refused.rc == 2);
  CHECK_THAT(refused.err, Catch::Contains("holds the checkpoints of another run than " + mine.string()));
  CHECK(read_text(other / "latest") == latest);
  CHECK(fs::exists(other / "step_00000002"));
  // Through a symlink to one of its steps, a run goes on in that step's
  // directory: it was refused as "another run", and without --checkpoint-dir
  // it wrote into the symlink's directory.
  fs::create_directory_symlink(mine / "step_00000002", dir / "best");
  const Run linked = braid_train(dir, "--resume " + (dir / "best").string() + " --steps 3");
  INFO(linked.err);
  CHECK(linked.rc == 0);
  CHECK(read_text(mine / "latest") == "step_00000003\n");
  CHECK_FALSE(fs::exists(dir / "latest"));
  CHECK(braid_train(dir, "--resume " + (dir / "best").string() + " --steps 3 --checkpoint-dir " + mine.string()).rc ==
        0);
  // Into a new directory, or on into its own, a resumed run goes on.
  CHECK(braid_train(dir, "--resume " + mine.string() + " --steps 3 --checkpoint-dir " + fresh.string()).rc == 0);
  CHECK(braid_train(dir, "--resume " + (mine / "step_00000002").string() + " --steps 3 --checkpoint-dir " +
                             mine.string()).rc == 0);
}

// A step's config.json records the interval, not the directory: repeating
// a run saved at intervals was refused with "--checkpoint-interval needs
// --checkpoint-dir", a flag the user never gave.
TEST_CASE("a --config with a saved checkpoint interval asks for a directory of its own", "[cli][checkpoint]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const fs::path ckpt = dir / "ckpt";
  REQUIRE(braid_train(dir, kTiny + "--data " + text.string() + " --steps 2 --checkpoint-interval 1 --checkpoint-dir " +
                               ckpt.string()).rc == 0);
  const std::string config = (ckpt / "step_00000002" / "config.json").string();
  const Run refused = braid_train(dir, "--config " + config);
  CHECK(refused.rc == 2);
  CHECK_THAT(refused.err, Catch::Contains("--config " + config + " sets checkpoint_interval 1, which needs a "
                                          "directory: pass a new --checkpoint-dir beside it"));
  CHECK(braid_train(dir, "--config " + config + " --checkpoint-dir " + (dir / "again").string()).rc == 0);
  CHECK(braid_train(dir, "--config " + config + " --checkpoint-interval 0").rc == 0);
  // --eval-only and --consolidate save nothing: the saved interval does
  // not count for them, and --checkpoint-interval 0 is no refused flag.
  const std::string weights = (dir / "w.safetensors").string();
  CHECK(braid_train(dir, "--consolidate " + ckpt.string() + " --out " + weights + " --config " + config).rc == 0);
  CHECK(braid_train(dir, "--consolidate " + ckpt.string() + " --out " + weights + " --config " + config +
                             " --checkpoint-interval 0").rc == 0);
  CHECK(braid_train(dir, "--eval-only --init-from " + weights + " --config " + config + " --data " + text.string())
            .rc == 0);
}

// A step's loss is taken before its update: a last step whose update broke
// the model (NaN) was saved and the run exited 0. The validation loss after
// it now stops the run before the save.
TEST_CASE("a last step that breaks the model fails and leaves no checkpoint of it", "[cli][checkpoint]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const fs::path ckpt = dir / "ckpt";
  const Run r = braid_train(dir, kTiny + "--data " + text.string() + " --steps 1 --warmup-steps 0 --lr 1e25 "
                                 "--grad-clip 0 --checkpoint-dir " + ckpt.string());
  CHECK(r.rc == 1);
  CHECK_THAT(r.err, Catch::Contains("the validation loss became") && Catch::Contains("after step 1"));
  CHECK_FALSE(fs::exists(ckpt / "latest"));
}

// A directory removed (or its lock file) while a run held it was made
// again by the run's next save, unheld, so a second run could take it and
// both wrote their steps there.
TEST_CASE("a run takes its removed --checkpoint-dir again before saving, or stops if another run took it",
          "[cli][checkpoint]") {
  test::TempDir dir;
  const fs::path ckpt = dir / "ckpt";
  auto held = DirectoryLock::take(ckpt, "the first run");
  REQUIRE(held != nullptr);
  held->reclaim();  // still its own: nothing happens
  fs::remove_all(ckpt);
  held->reclaim();  // taken again
  CHECK(fs::exists(ckpt / ".braid-train.lock"));
  CHECK_THROWS_WITH(DirectoryLock::take(ckpt, "a second run"), Catch::Contains("in use by another run (the first run)"));
  // Replaced by a directory that another run holds.
  fs::rename(ckpt, dir / "gone");
  auto other = DirectoryLock::take(ckpt, "the other run");
  REQUIRE(other != nullptr);
  CHECK_THROWS_WITH(held->reclaim(), Catch::Contains("in use by another run (the other run)"));
}

TEST_CASE("a run whose --checkpoint-dir another run took meanwhile stops before its next save", "[cli][checkpoint]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const fs::path ckpt = dir / "ckpt", pid_file = dir / "pid";
  Run run;
  std::atomic<bool> ended{false};
  std::thread training([&] {
    run = test::run_shell(dir, "echo $$ > " + pid_file.string() + "; exec " + std::getenv("BRAID_TRAIN") +
                                   " --n-layer 1 --n-head 2 --n-embd 16 --block-size 32 --batch-size 4 --data " +
                                   text.string() + " --steps 1000000 --eval-interval 1 --eval-batches 64 "
                                   "--checkpoint-interval 1 --checkpoint-dir " + ckpt.string());
    ended = true;
  });
  auto waited = [start = std::chrono::steady_clock::now()] { return std::chrono::steady_clock::now() - start; };
  while (!ended && !fs::exists(ckpt / "latest") && waited() < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // The other run holds a directory that then takes the place of the
  // first's, at once (RENAME_EXCHANGE).
  const fs::path staged = dir / "staged";
  auto other = DirectoryLock::take(staged, "the other run");
  REQUIRE(other != nullptr);
  const int exchanged = ::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, ckpt.c_str(), RENAME_EXCHANGE);
  const int exchange_errno = errno;
  while (!ended && waited() < std::chrono::seconds(60)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!ended) ::kill(std::stoi(read_text(pid_file)), SIGKILL);
  training.join();
  INFO(run.err);
  INFO("the exchange: " << std::strerror(exchange_errno));
  REQUIRE(exchanged == 0);
  // Stopped at its next save; or, when the exchange came in the middle of a
  // save (most steps spend their time evaluating), in that save: it
  // publishes only in the directory it holds ("is no longer the directory
  // this run holds"), and its staging directory went with the first run's
  // (writing a file in it: "No such file or directory").
  CHECK((run.rc == 2 || run.rc == 1));
  CHECK_THAT(run.err, Catch::Contains("is in use by another run (the other run)") ||
                          Catch::Contains("saving the checkpoint of step") &&
                              (Catch::Contains("No such file or directory") ||
                               Catch::Contains("is no longer the directory this run holds")));
  // Nothing of the first run in the other's directory.
  CHECK(std::distance(fs::directory_iterator(ckpt), fs::directory_iterator()) == 1);
}

// The same at an interval checkpoint of a step without an evaluation: the
// step's update broke the model, the checkpoint was published and `latest`
// named it, and only the next step's loss stopped the run.
TEST_CASE("an interval checkpoint is not written of a step whose update broke the model", "[cli][checkpoint]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const fs::path ckpt = dir / "ckpt";
  const Run r = braid_train(dir, kTiny + "--data " + text.string() + " --steps 3 --warmup-steps 0 --lr 1e25 "
                                 "--grad-clip 0 --eval-interval 0 --checkpoint-interval 1 --checkpoint-dir " +
                                 ckpt.string());
  CHECK(r.rc == 1);
  CHECK_THAT(r.err, Catch::Contains("the validation loss became") && Catch::Contains("after step 1"));
  CHECK_FALSE(fs::exists(ckpt / "latest"));
}

// A run resumed from an earlier step saves the same steps again. When such
// a save fails (a full disk again), the step it would replace keeps every
// file of the run that wrote it: nothing of the new run mixes in, and
// `latest` still names a checkpoint that loads.
TEST_CASE("a failed save over an existing step leaves that step whole", "[cli][checkpoint]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 4000);
  const fs::path ckpt = dir / "ckpt";
  const std::string common =
      kTiny + "--data " + text.string() + " --checkpoint-dir " + ckpt.string() + " --checkpoint-interval 2 ";
  REQUIRE(braid_train(dir, common + "--steps 4").rc == 0);
  const fs::path step4 = ckpt / "step_00000004";
  std::map<std::string, std::string> before;
  for (const auto& e : fs::directory_iterator(step4)) before[e.path().filename().string()] = read_text(e.path());
  REQUIRE(before.count("optimizer.safetensors") == 1);
  // 48 KiB: room for the model file (34 KiB), not for the optimizer's.
  REQUIRE(before.at("model.safetensors").size() < 48 * 1024);
  REQUIRE(before.at("optimizer.safetensors").size() > 48 * 1024);
  const std::string limited = "trap '' XFSZ; ulimit -f 48; exec " + std::string(std::getenv("BRAID_TRAIN")) + " " +
                              common + "--steps 4 --lr 0.05 --resume " + (ckpt / "step_00000002").string() +
                              " > /dev/null 2> " + (dir / "full.err").string();
  const int status = std::system(("bash -c \"" + limited + "\"").c_str());
  INFO(read_text(dir / "full.err"));
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 1));
  CHECK_THAT(read_text(dir / "full.err"),
             Catch::Contains("saving the checkpoint of step 4 failed; " + (ckpt / "latest").string() +
                             " names step_00000004, the last step written whole"));
  std::map<std::string, std::string> after;
  for (const auto& e : fs::directory_iterator(step4)) after[e.path().filename().string()] = read_text(e.path());
  CHECK(after == before);
  CHECK(read_text(ckpt / "latest") == "step_00000004\n");
  CHECK_FALSE(fs::exists(ckpt / "step_00000004.partial"));
  CHECK(braid_train(dir, common + "--steps 5 --resume " + ckpt.string()).rc == 0);
  CHECK(read_text(ckpt / "latest") == "step_00000005\n");
}

TEST_CASE("--sample generates the same text for the same seed", "[cli]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 2000);
  const std::string w = (dir / "w.safetensors").string();
  REQUIRE(braid_train(dir, kTiny + "--steps 0 --data " + text.string() + " --init-out " + w).rc == 0);
  const std::string args = "--init-from " + w + " --steps 0 --data " + text.string() + " --sample 40 ";
  const Run greedy = braid_train(dir, args + "--temperature 0");
  const Run a = braid_train(dir, args + "--seed 9"), b = braid_train(dir, args + "--seed 9");
  REQUIRE(greedy.rc == 0);
  REQUIRE(a.rc == 0);
  CHECK_THAT(a.out, Catch::Contains("--- sample (40 bytes"));
  CHECK(a.out == b.out);
  CHECK(a.out != greedy.out);
}

// A small file's validation split repeated its few windows without a word.
TEST_CASE("a validation split with fewer windows than an evaluation draws is noted", "[cli]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const fs::path text = write_text(dir, 2000);  // 200 bytes of validation: 168 windows of 32
  const Run few = braid_train(dir, kTiny + "--steps 1 --data " + text.string() + " --eval-batches 50");
  REQUIRE(few.rc == 0);
  CHECK_THAT(few.err, Catch::Contains("an evaluation draws 200 sequences (--eval-batches 50 x --batch-size 4), but "
                                      "the validation split (the last 10% of the data, 200 bytes) holds 168 distinct "
                                      "windows of 32 bytes: they repeat"));
  const Run enough = braid_train(dir, kTiny + "--steps 1 --data " + text.string() + " --eval-batches 40");
  REQUIRE(enough.rc == 0);
  CHECK_THAT(enough.err, !Catch::Contains("they repeat"));
}

}  // namespace
}  // namespace braid::trainer
