// End-to-end runs of braid-train as nanoGPT / Megatron users drive it
// (issue 17): nanoGPT's underscore spellings, --out-dir, --log-interval,
// --config and the config.json beside every checkpoint, wall-clock time in
// metrics lines, --eval-only --init-from a checkpoint directory, checkpoint
// files under the user's umask, and the summary of a --tp run.
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "cli_fixtures.h"
#include "model_fixtures.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/model/param_table.h"
#include "tests/tools/launch_harness.h"

namespace braid::trainer {
namespace {

namespace fs = std::filesystem;
using test::braid_train;
using test::have_binary;
using test::read_text;
using test::Run;
using test::write_text;

std::vector<nlohmann::json> metrics_lines(const fs::path& p) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::vector<double> losses(const fs::path& p) {
  std::vector<double> out;
  for (const auto& line : metrics_lines(p)) out.push_back(line["loss"].get<double>());
  return out;
}

TEST_CASE("nanoGPT's underscore spellings, --out_dir and --log_interval drive the same run", "[cli][habits]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const std::string text = write_text(dir, 4000).string();
  const std::string dashed =
      "--n-layer 1 --n-head 2 --n-embd 16 --block-size 32 --batch-size 4 --eval-batches 1 --steps 6 --lr 0.01 "
      "--warmup-steps 2 --eval-interval 3 --seed 5 --data " + text;
  const std::string underscored =
      "--n_layer 1 --n_head 2 --n_embd 16 --block_size 32 --batch_size 4 --eval_iters 1 --max_iters 6 "
      "--learning_rate 0.01 --warmup_iters 2 --eval_interval 3 --seed 5 --data " + text;
  const Run a = braid_train(dir, dashed + " --metrics " + (dir / "a.jsonl").string());
  REQUIRE(a.rc == 0);
  const fs::path out = dir / "out";
  const Run b = braid_train(dir, underscored + " --log_interval 2 --out_dir " + out.string() + " --metrics " +
                                     (dir / "b.jsonl").string());
  REQUIRE(b.rc == 0);
  CHECK(losses(dir / "a.jsonl") == losses(dir / "b.jsonl"));
  REQUIRE(losses(dir / "a.jsonl").size() == 6);
  // Without --log-interval a 6-step run prints every step; with 2, steps 2, 4,
  // 6 and the evaluation at step 3.
  CHECK_THAT(a.err, Catch::Contains("step 1/6"));
  for (const char* line : {"step 2/6", "step 3/6", "step 4/6", "step 6/6"}) CHECK_THAT(b.err, Catch::Contains(line));
  for (const char* line : {"step 1/6", "step 5/6"}) CHECK_THAT(b.err, !Catch::Contains(line));
  // --out_dir is where checkpoints go, with the run's settings beside them.
  const nlohmann::json config = nlohmann::json::parse(read_text(out / "step_00000006" / "config.json"));
  CHECK(config["n_layer"] == 1);
  CHECK(config["steps"] == 6);
  CHECK(config["warmup_steps"] == 2);
  CHECK(config["strategy"] == "none");
  CHECK(config["lr"].get<double>() == 0.01);  // as given, not float 0.01 widened to 0.009999999776482582
  CHECK(config["weight_decay"].get<double>() == 0.1);

  const Run bad = braid_train(dir, "--log_interval -1 --steps 1");
  CHECK(bad.rc == 2);
  CHECK_THAT(bad.err, Catch::Contains("--log-interval"));

  // A flag given twice takes the last value, as argparse does (CLI11
  // refused it: "At Most 1 required but received 2"), under either spelling.
  const Run twice = braid_train(dir, dashed + " --steps 2 --max_iters 3");
  CHECK(twice.rc == 0);
  CHECK_THAT(twice.err, Catch::Contains("step 3/3"));
}

TEST_CASE("--config FILE repeats a run from its checkpoint's config.json; flags override it", "[cli][habits]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const std::string text = write_text(dir, 4000).string();
  const std::string ckpt = (dir / "ckpt").string();
  REQUIRE(braid_train(dir, "--n-layer 1 --n-head 2 --n-embd 16 --block-size 32 --batch-size 4 --eval-batches 1 "
                           "--steps 4 --lr 0.02 --seed 9 --data " + text + " --checkpoint-dir " + ckpt +
                               " --metrics " + (dir / "a.jsonl").string())
              .rc == 0);
  const std::string config = ckpt + "/step_00000004/config.json";
  REQUIRE(fs::exists(config));
  // Run again from the config alone: the same losses, step for step.
  REQUIRE(braid_train(dir, "--config " + config + " --metrics " + (dir / "b.jsonl").string()).rc == 0);
  CHECK(losses(dir / "a.jsonl") == losses(dir / "b.jsonl"));
  REQUIRE(losses(dir / "a.jsonl").size() == 4);
  // A flag wins over the file.
  REQUIRE(braid_train(dir, "--config " + config + " --max_iters 2 --metrics " + (dir / "c.jsonl").string()).rc == 0);
  const auto c = losses(dir / "c.jsonl");
  REQUIRE(c.size() == 2);
  CHECK(c[0] == losses(dir / "a.jsonl")[0]);

  std::ofstream(dir / "typo.json") << R"({"n_layers": 2})";
  Run r = braid_train(dir, "--config " + (dir / "typo.json").string());
  CHECK(r.rc == 2);
  CHECK_THAT(r.err, Catch::Contains("unknown setting 'n_layers'"));
  std::ofstream(dir / "broken.json") << "{\"n_layer\": ";
  r = braid_train(dir, "--config " + (dir / "broken.json").string());
  CHECK(r.rc == 2);
  CHECK_THAT(r.err, Catch::Contains("not valid JSON"));
  r = braid_train(dir, "--config " + (dir / "missing.json").string());
  CHECK(r.rc == 2);
  CHECK_THAT(r.err, Catch::Contains("cannot read the --config file"));
}

double eval_loss(const std::string& out) {
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex("eval_loss: (\\S+)")));
  return std::stod(m[1]);
}

TEST_CASE("--eval-only --init-from takes a checkpoint directory (its latest step) or refuses naming what it sought",
          "[cli][habits]") {
  if (!have_binary()) return;
  test::TempDir dir;
  const std::string text = write_text(dir, 2000).string();
  const fs::path ckpt = dir / "ckpt";
  REQUIRE(braid_train(dir, "--n-layer 1 --n-head 2 --n-embd 16 --block-size 32 --batch-size 4 --eval-batches 1 "
                           "--steps 4 --checkpoint-interval 2 --lr 0.02 --data " + text + " --checkpoint-dir " +
                               ckpt.string())
              .rc == 0);
  const std::string eval = " --eval-only --data " + text;
  const Run file = braid_train(dir, "--init-from " + (ckpt / "step_00000004" / "model.safetensors").string() + eval);
  REQUIRE(file.rc == 0);
  const Run latest = braid_train(dir, "--init-from " + ckpt.string() + eval);
  REQUIRE(latest.rc == 0);
  CHECK(eval_loss(latest.out) == eval_loss(file.out));
  const Run step2 = braid_train(dir, "--init-from " + (ckpt / "step_00000002").string() + eval);
  REQUIRE(step2.rc == 0);
  CHECK(eval_loss(step2.out) != eval_loss(file.out));

  fs::create_directories(dir / "empty");
  const Run none = braid_train(dir, "--init-from " + (dir / "empty").string() + eval);
  CHECK(none.rc == 2);
  CHECK_THAT(none.err, Catch::Contains("state.json") && Catch::Contains("latest"));
  CHECK_THAT(none.err, !Catch::Contains("underflow"));
}

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

TEST_CASE("checkpoint files honour the umask; metrics lines carry the wall clock", "[cli][habits]") {
  if (!have_binary()) return;
  const char* bin = std::getenv("BRAID_TRAIN");
  test::TempDir dir;
  const std::string text = write_text(dir, 2000).string();
  const std::string args = " --n-layer 1 --n-head 2 --n-embd 16 --block-size 32 --batch-size 4 --eval-batches 1 "
                           "--steps 2 --data " + text + " --checkpoint-dir ";
  for (const unsigned umask : {022u, 077u, 002u}) {
    const fs::path ckpt = dir / ("ckpt" + std::to_string(umask));
    const double before = static_cast<double>(std::time(nullptr));
    char shell_umask[8];
    std::snprintf(shell_umask, sizeof shell_umask, "%03o", umask);
    const Run r = test::run_shell(dir, std::string("umask ") + shell_umask + "; " + bin + args + ckpt.string() +
                                           " --metrics " + (ckpt.string() + ".jsonl"));
    REQUIRE(r.rc == 0);
    const double after = static_cast<double>(std::time(nullptr)) + 1;
    INFO("umask " << shell_umask);
    const unsigned expected = 0666 & ~umask;
    for (const char* name : {"model.safetensors", "optimizer.safetensors", "state.json", "config.json"}) {
      INFO(name);
      CHECK(mode_of(ckpt / "step_00000002" / name) == expected);
    }
    CHECK(mode_of(ckpt / "latest") == expected);
    const auto lines = metrics_lines(ckpt.string() + ".jsonl");
    REQUIRE(lines.size() == 2);
    for (const auto& line : lines) {
      const double t = line["time"].get<double>();
      CHECK(t >= before);
      CHECK(t <= after);
      const std::string iso = line["timestamp"].get<std::string>();
      CHECK(std::regex_match(iso, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)")));
      // The ISO text is the same instant as "time".
      std::tm utc{};
      REQUIRE(::strptime(iso.c_str(), "%Y-%m-%dT%H:%M:%S", &utc) != nullptr);
      CHECK(static_cast<double>(::timegm(&utc)) == Approx(std::floor(t)).margin(0.5));
    }
    CHECK(lines[1]["time"].get<double>() >= lines[0]["time"].get<double>());
  }
}

long long count_before(const std::string& text, const std::string& what) {
  std::smatch m;
  REQUIRE(std::regex_search(text, m, std::regex("(\\d+) " + what)));
  return std::stoll(m[1]);
}

TEST_CASE("the summary of a --tp 2 run names the mesh, the whole model's parameters and each rank's share",
          "[cli][habits][launch]") {
  if (!have_binary() || std::getenv("BRAID_LAUNCH") == nullptr) return;
  const std::string train = std::getenv("BRAID_TRAIN");
  const std::string model = " --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --batch-size 8 --eval-interval 0"
                            " --eval-batches 1 --steps 2";
  test::TempDir dir;
  const Run one = braid_train(dir, model);
  REQUIRE(one.rc == 0);
  const long long total = count_before(one.err, "parameters in total");
  braid::test::JobDir job;
  const braid::test::LaunchResult run =
      braid::test::run_launch(job, braid::test::shell_job(2, "exec " + train + model + " --tp 2", job));
  INFO(run.out << run.err);
  REQUIRE(run.status == 0);
  CHECK(count_before(run.err, "parameters in total") == total);
  const long long share = count_before(run.err, "parameters\n");  // rank map: rank 0's part
  CHECK(share < total);
  CHECK(share > total / 2);  // wte and wpe are whole on every TP rank
  CHECK_THAT(run.err, Catch::Contains("each rank holds its TP / PP part: " + std::to_string(share)));
  CHECK_THAT(run.err, Catch::Contains("mesh dp 1 x tp 2 x pp 1; DP axis: none (one DP rank: no DP communication"));
  CHECK_THAT(run.err + run.out, !Catch::Contains("one process, no communication"));
  CHECK_THAT(run.out, Catch::Contains("traffic per rank per step, by group") && Catch::Contains("TP all-reduce wait"));
  // The table before training is not called a peak (its activations are
  // not taken yet); the end's is.
  CHECK_THAT(run.err, Catch::Contains("memory per rank before the first step, MiB") &&
                          !Catch::Contains("memory per rank, peak MiB"));
  CHECK_THAT(run.out, Catch::Contains("memory per rank, peak MiB"));
}

TEST_CASE("a --pp 2 checkpoint's shards hold whole tensors under their names and shapes; --init-from reads it",
          "[cli][habits][launch]") {
  if (!have_binary() || std::getenv("BRAID_LAUNCH") == nullptr) return;
  const std::string train = std::getenv("BRAID_TRAIN");
  braid::test::JobDir job;
  const fs::path ckpt = job.path() / "ckpt";
  const std::string args = " --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --batch-size 8 --eval-interval 0"
                           " --eval-batches 1 --steps 2 --pp 2 --micro-batches 2 --checkpoint-dir " + ckpt.string();
  const braid::test::LaunchResult run =
      braid::test::run_launch(job, braid::test::shell_job(2, "exec " + train + args, job));
  INFO(run.out << run.err);
  REQUIRE(run.status == 0);
  const GptConfig c{2, 2, 16, 16, 256};
  std::map<std::string, std::vector<std::int64_t>> seen;
  for (const fs::path& shard : {ckpt / "step_00000002" / "shard_00000_of_00002.safetensors",
                               ckpt / "step_00000002" / "shard_00001_of_00002.safetensors"}) {
    const SafetensorsFile f = SafetensorsFile::read(shard);
    for (const std::string& name : f.names()) {
      CHECK(name.find('@') == std::string::npos);
      seen[name] = f.shape(name);
    }
  }
  const ParamTable table = ParamTable::gpt(c, ModelLayout::whole(c));
  for (const ParamView& v : table.views()) {
    INFO(v.name);
    for (const std::string prefix : {"", "m.", "v."}) {
      REQUIRE(seen.count(prefix + v.name) == 1);
      CHECK(seen[prefix + v.name] == v.full_shape);
    }
  }
  // The sharded checkpoint's weights evaluate on one process as its consolidation does.
  test::TempDir dir;
  const Run direct = braid_train(dir, "--eval-only --init-from " + ckpt.string());
  REQUIRE(direct.rc == 0);
  const std::string whole = (dir / "whole.safetensors").string();
  REQUIRE(braid_train(dir, "--consolidate " + ckpt.string() + " --out " + whole).rc == 0);
  const Run consolidated = braid_train(dir, "--eval-only --init-from " + whole);
  REQUIRE(consolidated.rc == 0);
  CHECK(eval_loss(direct.out) == eval_loss(consolidated.out));
}

TEST_CASE("tools/train/plot_metrics.py draws a metrics file as a PNG and refuses a broken one", "[cli][habits]") {
  const char* plot = std::getenv("BRAID_PLOT");
  if (!have_binary() || plot == nullptr) return;
  test::TempDir dir;
  const fs::path metrics = dir / "m.jsonl", png = dir / "m.png";
  REQUIRE(braid_train(dir, "--n-layer 1 --n-head 2 --n-embd 16 --block-size 32 --batch-size 4 --eval-batches 1 "
                           "--steps 6 --eval-interval 3 --metrics " + metrics.string())
              .rc == 0);
  const std::string python = std::string("/usr/bin/python3 ") + plot + " ";
  const Run r = test::run_shell(dir, python + metrics.string() + " " + png.string());
  if (r.rc == 3) {
    WARN("skipped: " << r.err);  // no python3-matplotlib
    return;
  }
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("(6 steps)"));
  const std::string bytes = read_text(png);
  REQUIRE(bytes.size() > 1000);
  CHECK(bytes.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  std::ofstream(dir / "bad.jsonl") << "{\"step\": 1, \"loss\": 5}\nnot json\n";
  const Run bad = test::run_shell(dir, python + (dir / "bad.jsonl").string() + " " + (dir / "bad.png").string());
  CHECK(bad.rc == 2);
  CHECK_THAT(bad.err, Catch::Contains("line 2 is not JSON"));
  CHECK_FALSE(fs::exists(dir / "bad.png"));
}

}  // namespace
}  // namespace braid::trainer
