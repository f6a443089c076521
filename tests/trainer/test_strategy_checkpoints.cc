// Sharded checkpoints of the data-parallel strategies: exact resume at the
// same world size, resume at another world size and under one process,
// consolidation into one weights file, and a rank killed by SIGKILL in the
// middle of a run through the real braid-launch.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <regex>
#include <thread>
#include <vector>

#include "strategy_fixtures.h"
#include "tests/comm/harness.h"
#include "tests/tools/launch_harness.h"
#include "trainer/checkpoint/atomic_file.h"
#include "trainer/checkpoint/sharded.h"

namespace braid::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

TrainOptions checkpoint_options(const fs::path& dir) {
  TrainOptions o;
  o.model = GptConfig{2, 2, 16, 16, 256};
  o.batch_size = 12;  // splits into 1, 2 and 3 ranks
  o.steps = 4;
  o.lr = 1e-2f;
  o.warmup_steps = 1;
  o.eval_batches = 1;
  o.seed = 8;
  o.bucket_mb = 0.01;
  o.checkpoint_dir = dir.string();
  return o;
}

std::vector<double> doubles(const json& j) { return j.get<std::vector<double>>(); }

// Steps 1-2, a checkpoint, steps 3-4; records the losses and the parameters
// at the checkpoint.
void train_save_train(Trainer& t, json& out) {
  for (int i = 0; i < 2; ++i) out["loss"].push_back(t.train_step().loss);
  t.save_checkpoint();
  out["params"] = test::gather_params(t);
  for (int i = 0; i < 2; ++i) out["loss"].push_back(t.train_step().loss);
}

void resume_train(Trainer& t, json& out) {
  out["start"] = t.step();
  for (int i = 0; i < 2; ++i) out["loss"].push_back(t.train_step().loss);
}

TEST_CASE("sharded checkpoints resume exactly, at other world sizes, and consolidate", "[strategy][checkpoint]") {
  const TextCorpus corpus = test::synthetic_corpus();
  for (const char* s : {"dp", "ddp", "zero1", "zero2", "zero3"}) {
    INFO("strategy " << s);
    test::TempDir dir;
    TrainOptions o = checkpoint_options(dir / "ckpt");
    o.strategy = s;
    const json first = test::run_trainers(2, o, corpus, train_save_train)[0];
    const std::vector<double> tail(first["loss"].begin() + 2, first["loss"].end());
    REQUIRE(fs::exists(dir / "ckpt" / "step_00000002" / "manifest.json"));

    TrainOptions resumed = o;
    resumed.resume = o.checkpoint_dir;
    const json same = test::run_trainers(2, resumed, corpus, resume_train)[1];
    CHECK(same["start"] == 2);
    CHECK(doubles(same["loss"]) == tail);  // bit for bit

    resumed.strategy = s == std::string("zero3") ? "ddp" : "zero3";
    const json wider = test::run_trainers(3, resumed, corpus, resume_train)[2];
    resumed.strategy = "none";
    const json single = test::run_trainers(1, resumed, corpus, resume_train)[0];
    CHECK(test::max_abs_diff(doubles(wider["loss"]), tail) < 1e-5);
    CHECK(test::max_abs_diff(doubles(single["loss"]), tail) < 1e-5);

    // The consolidated file loads into the single-process model and holds
    // exactly the parameters the ranks had at the checkpoint.
    CHECK(consolidate_checkpoint(dir / "ckpt", dir / "full.safetensors") == 2);
    Gpt model(o.model, ModelLayout::whole(o.model), nullptr);
    load_weights(dir / "full.safetensors", model);
    const std::vector<float> saved = first["params"].get<std::vector<float>>();
    REQUIRE(saved.size() == model.params().count());
    CHECK(std::equal(saved.begin(), saved.end(), model.params().data()));
  }
}

TEST_CASE("a sharded checkpoint missing a shard is refused, naming what is missing", "[strategy][checkpoint]") {
  const TextCorpus corpus = test::synthetic_corpus();
  test::TempDir dir;
  TrainOptions o = checkpoint_options(dir / "ckpt");
  o.strategy = "zero2";
  test::run_trainers(2, o, corpus, [](Trainer& t, json&) {
    t.train_step();
    t.save_checkpoint();
  });
  const fs::path step = dir / "ckpt" / "step_00000001";
  fs::remove(step / "shard_00001_of_00002.safetensors");
  CHECK_THROWS_WITH(consolidate_checkpoint(dir / "ckpt", dir / "full.safetensors"),
                    Catch::Contains("shard_00001_of_00002.safetensors"));
  CHECK_FALSE(fs::exists(dir / "full.safetensors"));
}

// Ranks that write their shards to different directories (a disk of their
// own node; a relative --checkpoint-dir from different working directories)
// used to get a published step that rank 0 could not load: it held rank 0's
// shard only. Now nothing is published and every rank says why.
// One zero1 step on 2 ranks, then a save into each rank's checkpoint_dir(rank).
braid::test::RunResult train_and_save(const std::function<fs::path(int rank)>& checkpoint_dir) {
  const TextCorpus corpus = test::synthetic_corpus();
  return braid::test::run_ranks(
      2,
      [&](comm::Communicator& comm) {
        TrainOptions o = checkpoint_options(checkpoint_dir(comm.rank()));
        o.strategy = "zero1";
        Trainer t(o, corpus, &comm);
        t.start();
        t.train_step();
        t.save_checkpoint();
      },
      braid::test::run_options(std::chrono::seconds(60), braid::test::test_config(std::chrono::seconds(30))));
}

TEST_CASE("a sharded save whose shards land in different directories publishes nothing and fails every rank",
          "[strategy][checkpoint]") {
  test::TempDir dir;
  const fs::path root = dir.path();
  const auto result = train_and_save([&](int rank) { return root / ("node" + std::to_string(rank)) / "ck"; });
  INFO(result.summary());
  REQUIRE(result.ranks.size() == 2);
  for (const auto& r : result.ranks) {
    CHECK_FALSE(r.ok());
    CHECK_THAT(r.message, Catch::Contains("the checkpoint of step 1 is not published: rank 0 does not see 1 of the "
                                          "2 shards (rank 1's first)"));
  }
  CHECK_FALSE(fs::exists(root / "node0" / "ck" / "latest"));
  CHECK_FALSE(fs::exists(root / "node0" / "ck" / "step_00000001"));
}

// Rank 0 publishing the step failed alone (a full disk at its manifest or
// config.json, `latest` it cannot replace): the other ranks returned from
// the save as if it had worked, trained on, and failed later on a closed
// communicator, never saying the save had failed. Every rank now waits for
// the outcome; here `latest` is a directory rank 0 cannot replace.
TEST_CASE("a sharded save that rank 0 fails to publish fails every rank", "[strategy][checkpoint]") {
  test::TempDir dir;
  const fs::path ck = dir.path() / "ck";
  fs::create_directories(ck / "latest");
  const auto result = train_and_save([&](int) { return ck; });
  INFO(result.summary());
  REQUIRE(result.ranks.size() == 2);
  CHECK_FALSE(result.ranks[0].ok());
  CHECK_THAT(result.ranks[0].message, Catch::Contains("latest"));
  CHECK_FALSE(result.ranks[1].ok());
  CHECK_THAT(result.ranks[1].message, Catch::Contains("the checkpoint of step 1: rank 0 could not write its part"));
  CHECK_FALSE(fs::exists(ck / "step_00000001.partial"));
}

// braid-train's path when both it and braid-launch are known (meson test
// sets them); else null, with the test marked skipped.
const char* launched_train() {
  const char* train = std::getenv("BRAID_TRAIN");
  if (train != nullptr && std::getenv("BRAID_LAUNCH") != nullptr) return train;
  WARN("skipped: BRAID_TRAIN or BRAID_LAUNCH is not set (run through `meson test`)");
  return nullptr;
}

// "step_00000007\n" -> 7.
std::int64_t latest_step(const fs::path& dir) {
  std::smatch m;
  const std::string text = braid::test::read_file(dir / "latest");
  REQUIRE(std::regex_search(text, m, std::regex("step_(\\d+)")));
  return std::stoll(m[1]);
}

TEST_CASE("a rank killed mid-run stops the job, naming it; the last checkpoint resumes", "[strategy][launch]") {
  const char* train = launched_train();
  if (train == nullptr) return;
  braid::test::JobDir job;
  const fs::path ckpt = job.path() / "ckpt";
  const std::string args = std::string(train) +
                           " --strategy zero2 --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --batch-size 12"
                           " --eval-interval 0 --eval-batches 1 --steps 100000 --checkpoint-interval 5"
                           " --checkpoint-dir " + ckpt.string();
  // Each rank records its pid (the job directory is $0), then becomes braid-train.
  const std::string script = "echo $$ > \"$0/pid_$BRAID_RANK\"; exec " + args;
  braid::test::LaunchedJob launched(job, braid::test::shell_job(2, script, job));
  braid::test::wait_for_file(ckpt / "latest", std::chrono::seconds(60));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // mid-run, maybe mid-checkpoint
  const auto pids = job.recorded_pids();
  REQUIRE(pids.count(1) == 1);
  const auto killed = std::chrono::steady_clock::now();
  REQUIRE(::kill(pids.at(1), SIGKILL) == 0);
  const int status = launched.wait(std::chrono::seconds(30));
  CHECK(status != 0);
  CHECK(std::chrono::steady_clock::now() - killed < std::chrono::seconds(20));
  CHECK_THAT(launched.err(), Catch::Contains("rank 1 (pid ") && Catch::Contains("killed by signal 9"));

  // The newest complete checkpoint resumes, on another world size.
  const std::int64_t step = latest_step(ckpt);
  CHECK(step % 5 == 0);
  const std::string resume = std::string(train) + " --resume " + ckpt.string() + " --steps " +
                             std::to_string(step + 2) + " --metrics \"$0/resumed.jsonl\"";
  const braid::test::LaunchResult again = braid::test::run_launch(job, braid::test::shell_job(3, resume, job));
  INFO(again.err);
  CHECK(again.status == 0);
  CHECK_THAT(again.out, Catch::Contains("traffic per rank per step"));
  CHECK(braid::test::sorted_lines(braid::test::read_file(job.path() / "resumed.jsonl")).size() == 2);
  // And its checkpoint consolidates through the CLI.
  const std::string consolidate = std::string(train) + " --consolidate " + ckpt.string() + " --out " +
                                  (job.path() / "full.safetensors").string() + " > /dev/null";
  CHECK(std::system(consolidate.c_str()) == 0);
  CHECK(read_weights_config(job.path() / "full.safetensors").n_embd == 16);
}

// braid-train checks before it trains: ranks given other directories, or
// a --checkpoint-dir on some ranks only, trained the whole run and then
// lost it at the first save.
TEST_CASE("braid-train refuses ranks that do not share rank 0's checkpoint directory before training",
          "[strategy][launch]") {
  const char* train = launched_train();
  if (train == nullptr) return;
  braid::test::JobDir job;
  const std::string args = std::string(train) +
                           " --strategy zero1 --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4"
                           " --eval-interval 0 --eval-batches 1 --steps 3";
  const auto elsewhere = braid::test::run_launch(
      job, braid::test::shell_job(2, "exec " + args + " --checkpoint-dir \"$0/node$BRAID_RANK\"", job));
  INFO(elsewhere.out << elsewhere.err);
  CHECK(elsewhere.status == 2);
  CHECK_THAT(elsewhere.err, Catch::Contains("[rank 0] braid-train: error: rank 1 does not see rank 0's "
                                            "--checkpoint-dir: every rank writes its shard"));
  CHECK_THAT(elsewhere.out, !Catch::Contains("step 1"));
  CHECK_FALSE(fs::exists(job.path() / "node0" / "latest"));
  // `flag` given to rank `rank` only: refused before training, naming it.
  auto given_to_one = [&](int rank, const std::string& flag, const std::string& difference) {
    const auto run = braid::test::run_launch(
        job, braid::test::shell_job(2,
                                    "if [ \"$BRAID_RANK\" = " + std::to_string(rank) + " ]; then exec " + args + " " +
                                        flag + "; else exec " + args + "; fi",
                                    job));
    INFO(run.out << run.err);
    CHECK(run.status == 2);
    CHECK_THAT(run.err, Catch::Contains("rank 1 was started with other settings than rank 0: " + difference));
  };
  given_to_one(1, "--checkpoint-dir \"$0/ck\"", "checkpoint_dir_given true (rank 0: false)");
  // --init-out on rank 0 only: rank 0 gathered the weights while rank 1
  // went on to train, a mismatch of all_reduce and all_gather.
  given_to_one(0, "--init-out \"$0/w.st\"", "init_out_given false (rank 0: true)");
  CHECK_FALSE(fs::exists(job.path() / "w.st"));
  // One directory, as every rank sees it: trains and publishes.
  const auto shared =
      braid::test::run_launch(job, braid::test::shell_job(2, "exec " + args + " --checkpoint-dir \"$0/shared\"", job));
  INFO(shared.out << shared.err);
  CHECK(shared.status == 0);
  CHECK(latest_step(job.path() / "shared") == 3);
}

// Rank 0 saves through its hold on the --checkpoint-dir it locked; the
// other ranks wrote their shards by name. With the directory replaced by
// another run's (RENAME_EXCHANGE) between two saves, rank 0 stopped at the
// next one, but rank 1 made that step's staging directory in the other
// run's and wrote its shard there. Each rank now saves through a hold of
// its own on the directory rank 0 locked.
TEST_CASE("a job whose --checkpoint-dir another run took meanwhile writes no shard there", "[strategy][launch]") {
  const char* train = launched_train();
  if (train == nullptr) return;
  braid::test::JobDir job;
  const fs::path ckpt = job.path() / "ckpt", staged = job.path() / "staged";
  const std::string args = std::string(train) +
                           " --strategy zero2 --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4"
                           " --eval-interval 0 --eval-batches 1 --steps 100000 --checkpoint-interval 2"
                           " --checkpoint-dir " + ckpt.string();
  braid::test::LaunchedJob launched(job, braid::test::shell_job(2, "exec " + args, job));
  braid::test::wait_for_file(ckpt / "latest", std::chrono::seconds(60));
  auto other = DirectoryLock::take(staged, "the other run");
  REQUIRE(other != nullptr);
  REQUIRE(::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, ckpt.c_str(), RENAME_EXCHANGE) == 0);
  const int status = launched.wait(std::chrono::seconds(30));
  INFO(launched.err());
  CHECK(status != 0);
  CHECK_THAT(launched.err(), Catch::Contains("is in use by another run (the other run)") ||
                                 Catch::Contains("is no longer the directory this run holds"));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(ckpt)) names.push_back(entry.path().filename().string());
  CHECK(names == std::vector<std::string>{".braid-train.lock"});
}

// A --checkpoint-dir renamed away mid-run: rank 0 takes the name again
// before the next save (DirectoryLock::reclaim) and the other ranks, told
// so, hold the new directory too; the job saves on there. A rename that
// lands between rank 0's look and the ranks' own (a few ms on two loaded
// cores) stops the job instead ("is no longer the directory this run
// holds"): the rename comes right after a save, with 2000 steps (~0.1-0.5 s)
// before the next, and up to three jobs run; one must save on.
TEST_CASE("a job whose --checkpoint-dir was renamed away takes the name again and saves on", "[strategy][launch]") {
  const char* train = launched_train();
  if (train == nullptr) return;
  braid::test::JobDir job;
  const fs::path ckpt = job.path() / "ckpt";
  const std::string args = std::string(train) +
                           " --strategy zero2 --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4"
                           " --eval-interval 0 --eval-batches 1 --steps 1000000 --checkpoint-interval 2000"
                           " --checkpoint-dir " + ckpt.string();
  bool saved_on = false;
  for (int attempt = 0; attempt < 3 && !saved_on; ++attempt) {
    fs::remove_all(ckpt);
    const fs::path gone = job.path() / ("gone" + std::to_string(attempt));
    braid::test::LaunchedJob launched(job, braid::test::shell_job(2, "exec " + args, job));
    braid::test::wait_for_file(ckpt / "latest", std::chrono::seconds(60));
    fs::rename(ckpt, gone);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    bool stopped = false;
    while (!fs::exists(ckpt / "latest") && std::chrono::steady_clock::now() < deadline) {
      stopped = launched.err().find("is no longer the directory this run holds") != std::string::npos;
      if (stopped) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    saved_on = fs::exists(ckpt / "latest");
    ::kill(launched.pid(), SIGTERM);
    launched.wait(std::chrono::seconds(30));
    INFO(launched.err());
    CHECK((saved_on || stopped));
    if (!saved_on) continue;
    CHECK_THAT(launched.err(), Catch::Contains("lost this run's hold") && Catch::Contains("holding it again"));
    CHECK(latest_step(ckpt) > latest_step(gone));
  }
  CHECK(saved_on);
}

// Each rank resolved --resume's `latest` on its own, and again when it
// loaded: ranks that found different steps (another run writing into the
// directory moved `latest` between them) trained on as diverged replicas,
// silently, and a rank could take its options from one step and its
// weights from the next. Each rank now pins the step it resolved and the
// ranks compare it before training; here rank 1 is handed another step.
TEST_CASE("ranks that resume from different steps are refused before training", "[strategy][launch]") {
  const char* train = launched_train();
  if (train == nullptr) return;
  braid::test::JobDir job;
  const std::string args = std::string(train) +
                           " --strategy ddp --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4"
                           " --eval-interval 0 --eval-batches 1";
  const auto first = braid::test::run_launch(
      job, braid::test::shell_job(2, "exec " + args + " --steps 4 --checkpoint-interval 2 --checkpoint-dir \"$0/ck\"",
                                  job));
  INFO(first.out << first.err);
  REQUIRE(first.status == 0);
  REQUIRE(latest_step(job.path() / "ck") == 4);
  const auto split = braid::test::run_launch(
      job, braid::test::shell_job(2,
                                  "if [ \"$BRAID_RANK\" = 1 ]; then R=\"$0/ck/step_00000002\"; else R=\"$0/ck\"; fi; "
                                  "exec " + args + " --steps 6 --resume \"$R\" --checkpoint-dir \"$0/next\"",
                                  job));
  INFO(split.out << split.err);
  CHECK(split.status == 2);
  CHECK_THAT(split.err, Catch::Contains("rank 1 resumes from step 2, rank 0 from step 4: the checkpoint's `latest` "
                                        "moved while the ranks read it"));
  CHECK_THAT(split.out, !Catch::Contains("step 5"));
  // The same step on every rank resumes.
  const auto same = braid::test::run_launch(
      job, braid::test::shell_job(2, "exec " + args + " --steps 6 --resume \"$0/ck\" --checkpoint-dir \"$0/next\"",
                                  job));
  INFO(same.out << same.err);
  CHECK(same.status == 0);
  CHECK(latest_step(job.path() / "next") == 6);
}

// A full disk on one rank (a file-size limit, as in test_cli.cc; over TCP,
// since the limit also stops shared-memory set-up): the save
// fails every rank, and the shards the others wrote do not stay in
// step_N.partial, holding the space the disk lacked.
TEST_CASE("a sharded save that fails on one rank leaves no partial step behind", "[strategy][launch]") {
  const char* train = launched_train();
  if (train == nullptr) return;
  braid::test::JobDir job;
  const fs::path ckpt = job.path() / "ckpt";
  const std::string args = std::string(train) +
                           " --strategy zero2 --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4"
                           " --eval-interval 0 --eval-batches 1 --steps 2 --checkpoint-interval 2 --checkpoint-dir " +
                           ckpt.string();
  const auto full = braid::test::run_launch(
      job, braid::test::shell_job(2, "export BRAID_TRANSPORT=tcp; trap '' XFSZ; [ \"$BRAID_RANK\" = 1 ] && ulimit -f 8; exec " + args, job));
  INFO(full.out << full.err);
  CHECK(full.status == 1);
  CHECK_THAT(full.err, Catch::Contains("step_00000002.partial/shard_00001_of_00002.safetensors") &&
                           Catch::Contains("File too large"));
  CHECK_FALSE(fs::exists(ckpt / "latest"));
  CHECK_FALSE(fs::exists(ckpt / "step_00000002"));
  CHECK_FALSE(fs::exists(ckpt / "step_00000002.partial"));
}

// braid-train with a model small enough for a launched job of a few steps.
std::string tiny_model(const char* train) {
  return std::string(train) +
         " --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4 --eval-interval 0 --eval-batches 1 ";
}

// A job started with --resume and restarted by --max-restarts goes on from
// the checkpoints its own attempts wrote (they record the job's run id), not
// from where it started, and never from an earlier job's checkpoints in the
// same directory. (A job resumed from one directory into another that holds
// an earlier job's checkpoints is refused: test_cli.cc.)
TEST_CASE("a restarted job resumes from its own checkpoints, not from where it started", "[strategy][launch]") {
  const char* train = launched_train();
  if (train == nullptr) return;
  braid::test::JobDir job;
  const std::string model = tiny_model(train);
  const fs::path ft = job.path() / "ft";
  // An earlier job left steps 7 and 8 in ft.
  const std::string earlier = model + "--steps 8 --checkpoint-interval 1 --checkpoint-dir " + ft.string();
  REQUIRE(braid::test::run_launch(job, {"-n", "1", "--", "sh", "-c", earlier}, {{"BRAID_RUN_ID", "earlier"}}).status ==
          0);
  REQUIRE(latest_step(ft) == 8);
  // This job goes on from the earlier job's step 7. Attempt 0 dies at once;
  // attempt 1 trains steps 8 and 9 from step 7, then dies; attempt 2 asks
  // for 11 steps again from step 7.
  const std::string run = model + "--resume " + (ft / "step_00000007").string() + " --checkpoint-dir " +
                          ft.string() + " --checkpoint-interval 1 --metrics \"$0/attempt_$BRAID_RESTART_COUNT.jsonl\"";
  const std::string script = "case $BRAID_RESTART_COUNT in 0) exit 3;; 1) " + run + " --steps 9; exit 3;; esac; exec " +
                             run + " --steps 11";
  const braid::test::LaunchResult r =
      braid::test::run_launch(job, braid::test::shell_job(1, script, job, {"--max-restarts", "2"}));
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  auto steps_in = [&](const char* file) {
    std::vector<std::int64_t> steps;
    std::ifstream in(job.path() / file);
    for (std::string line; std::getline(in, line);) steps.push_back(json::parse(line).at("step").get<std::int64_t>());
    return steps;
  };
  CHECK(steps_in("attempt_1.jsonl") == std::vector<std::int64_t>{8, 9});     // from 7, not from the earlier job's 8
  CHECK(steps_in("attempt_2.jsonl") == std::vector<std::int64_t>{10, 11});  // from its own step 9
  CHECK_THAT(r.err, Catch::Contains("restart 2: resuming from the last checkpoint in " + ft.string()));
  CHECK(latest_step(ft) == 11);
}

// An attempt whose save published its step but could not write `latest`
// (a full disk; here `latest` removed, or set back) left a whole step; the
// restart found no `latest`, started again from scratch and replaced that
// step, or resumed from the older step `latest` named and did its steps
// again. A `latest` left empty (a crash on a file system that does not keep
// the order of writes) failed every restart, each refusing it alike.
TEST_CASE("a restarted job resumes from a complete step that no latest names", "[strategy][launch]") {
  const char* train = launched_train();
  if (train == nullptr) return;
  enum Spoil { kRemoved, kSetBack, kEmptied };
  const Spoil how = GENERATE(kRemoved, kSetBack, kEmptied);
  INFO((how == kSetBack ? "latest names the older step 2" : how == kRemoved ? "no latest" : "latest empty"));
  braid::test::JobDir job;
  const fs::path ck = job.path() / "ck";
  const std::string run = tiny_model(train) + "--checkpoint-interval 2 --checkpoint-dir " + ck.string() +
                          " --metrics \"$0/attempt_$BRAID_RESTART_COUNT.jsonl\"";
  // Set back as a failed save leaves it: last written by step 2's save.
  const std::string latest = (ck / "latest").string();
  const std::string spoil = how == kSetBack ? "echo step_00000002 > " + latest + " && touch -r " +
                                                  (ck / "step_00000002" / "state.json").string() + " " + latest
                            : how == kRemoved ? "rm " + latest
                                              : ": > " + latest;
  const std::string script = "case $BRAID_RESTART_COUNT in 0) " + run + " --steps 4 && " + spoil +
                             "; exit 3;; esac; exec " + run + " --steps 6";
  const braid::test::LaunchResult r =
      braid::test::run_launch(job, braid::test::shell_job(1, script, job, {"--max-restarts", "1"}));
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains("restart 1: resuming from the last checkpoint in " +
                                    (ck / "step_00000004").string()));
  if (how == kEmptied)
    CHECK_THAT(r.err, Catch::Contains("restart 1: passing over what the checkpoint directory's 'latest' names: " +
                                      latest + " does not name a step (it is empty)"));
  std::vector<std::int64_t> steps;
  std::ifstream in(job.path() / "attempt_1.jsonl");
  for (std::string line; std::getline(in, line);) steps.push_back(json::parse(line).at("step").get<std::int64_t>());
  CHECK(steps == std::vector<std::int64_t>{5, 6});
  CHECK(latest_step(ck) == 6);
}

// A newer complete step that an earlier launch of the same run id left
// (a fixed --rdzv-id, a requeued job) above the step this launch went back
// to is not a failed save of this launch: the restart took it, and trained
// on the branch the user had rolled back from (a review helper's case).
TEST_CASE("a restart does not take a newer step an earlier launch of its run id left", "[strategy][launch]") {
  const char* train = launched_train();
  if (train == nullptr) return;
  braid::test::JobDir job;
  const fs::path ck = job.path() / "ck";
  const std::string model = tiny_model(train);
  const braid::test::EnvChanges same_id{{"BRAID_RUN_ID", "requeued"}};
  REQUIRE(braid::test::run_launch(job, {"-n", "1", "--", "sh", "-c", model + "--steps 6 --checkpoint-interval 2 "
                                                                          "--checkpoint-dir " + ck.string()},
                                  same_id)
              .status == 0);
  REQUIRE(latest_step(ck) == 6);
  const std::string run = model + "--resume " + (ck / "step_00000004").string() + " --checkpoint-dir " + ck.string() +
                          " --checkpoint-interval 1 --metrics \"$0/attempt_$BRAID_RESTART_COUNT.jsonl\"";
  const std::string script = "case $BRAID_RESTART_COUNT in 0) " + run + " --steps 5; exit 3;; esac; exec " + run +
                             " --steps 7";
  const braid::test::LaunchResult r =
      braid::test::run_launch(job, braid::test::shell_job(1, script, job, {"--max-restarts", "1"}), same_id);
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains("restart 1: resuming from the last checkpoint in " + ck.string() + "\n"));
  std::vector<std::int64_t> steps;
  std::ifstream in(job.path() / "attempt_1.jsonl");
  for (std::string line; std::getline(in, line);) steps.push_back(json::parse(line).at("step").get<std::int64_t>());
  CHECK(steps == std::vector<std::int64_t>{6, 7});  // from its own step 5, not the earlier launch's 6
}

// A run started without a launcher records no run id in its checkpoints. A
// job given that directory is refused (another run's checkpoints), and its
// restart took the checkpoints for its own: it resumed the other run's
// step, with that run's options, and wrote on into its directory.
TEST_CASE("a restarted job does not take over the checkpoints of a run without a run id", "[strategy][launch]") {
  const char* train = launched_train();
  if (train == nullptr) return;
  braid::test::JobDir job;
  const std::string model = tiny_model(train);
  const fs::path other = job.path() / "other";
  auto plain = braid::test::LaunchedJob::program(
      job, "plain", {"/bin/sh", "-c", "exec " + model + "--steps 2 --checkpoint-interval 2 --checkpoint-dir " + other.string()},
      {{"BRAID_RUN_ID", std::nullopt}, {"TORCHELASTIC_RUN_ID", std::nullopt}, {"BRAID_RANK", std::nullopt},
       {"RANK", std::nullopt}, {"BRAID_STORE_ADDR", std::nullopt}});
  INFO(plain->err());
  REQUIRE(plain->wait(std::chrono::seconds(60)) == 0);
  REQUIRE(latest_step(other) == 2);
  const braid::test::LaunchResult r = braid::test::run_launch(
      job, braid::test::shell_job(1, "exec " + model + "--steps 4 --checkpoint-interval 1 --checkpoint-dir " +
                                         other.string(), job, {"--max-restarts", "1"}));
  INFO(r.out << r.err);
  CHECK(r.status == 2);
  CHECK_THAT(r.err, !Catch::Contains("resuming from the last checkpoint"));
  CHECK(latest_step(other) == 2);
  CHECK_FALSE(fs::exists(other / "step_00000004"));
}

}  // namespace
}  // namespace braid::trainer
