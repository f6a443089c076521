// braid-train over a DP x TP x PP mesh through the real braid-launch: the
// rank map at the start, the pipeline's bubble, activations and TP / PP
// communication in the summary and the metrics, a checkpoint that
// consolidates through the CLI, and a bad combination refused with exit 2.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "model_fixtures.h"
#include "tests/tools/launch_harness.h"
#include "trainer/checkpoint/checkpoint.h"

namespace braid::trainer {
namespace {

const char* braid_train() {
  const char* train = std::getenv("BRAID_TRAIN");
  return train != nullptr && std::getenv("BRAID_LAUNCH") != nullptr ? train : nullptr;
}

constexpr const char* kTiny = " --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --batch-size 8"
                              " --eval-interval 0 --eval-batches 1 --steps 2";

TEST_CASE("braid-train --tp 2 --pp 2 reports the mesh and consolidates its checkpoint", "[mesh][launch]") {
  const char* train = braid_train();
  if (train == nullptr) {
    WARN("skipped: BRAID_TRAIN or BRAID_LAUNCH is not set (run through `meson test`)");
    return;
  }
  braid::test::JobDir job;
  const std::string ckpt = (job.path() / "ckpt").string();
  const std::string args = std::string(train) + kTiny + " --tp 2 --pp 2 --micro-batches 4 --schedule gpipe" +
                           " --metrics \"$0/m.jsonl\" --checkpoint-dir " + ckpt;
  const braid::test::LaunchResult run = braid::test::run_launch(job, braid::test::shell_job(4, "exec " + args, job));
  INFO(run.out << run.err);
  REQUIRE(run.status == 0);
  CHECK_THAT(run.err, Catch::Contains("tp groups: [0 1] [2 3]") && Catch::Contains("pp groups: [0 2] [1 3]"));
  CHECK_THAT(run.out, Catch::Contains("mesh dp 1 x tp 2 x pp 2, schedule gpipe") &&
                          Catch::Contains("theory (P-1)/(M+P-1) = 0.200") &&
                          Catch::Contains("pipeline bubble (idle of the slowest stage") &&
                          Catch::Contains("compute per step, stage by stage") &&
                          Catch::Contains("peak activation memory per stage") && Catch::Contains("TP all-reduce wait"));
  CHECK_THAT(braid::test::read_file(job.path() / "m.jsonl"),
             Catch::Contains("\"bubble_theory\":0.2") && Catch::Contains("\"pp_comm_ms\""));
  const std::string out = (job.path() / "full.safetensors").string();
  const std::string consolidate = std::string(train) + " --consolidate " + ckpt + " --out " + out + " > /dev/null";
  CHECK(std::system(consolidate.c_str()) == 0);
  CHECK(read_weights_config(out).n_layer == 2);
  // The same under the launcher: rank 0 alone writes it (every rank did).
  const std::string launched = (job.path() / "launched.safetensors").string();
  const braid::test::LaunchResult written = braid::test::run_launch(
      job, braid::test::shell_job(4, "exec " + std::string(train) + " --consolidate " + ckpt + " --out " + launched, job));
  INFO(written.out << written.err);
  CHECK(written.status == 0);
  const std::string said = "wrote the weights of step 2 of " + ckpt + " to " + launched;
  CHECK(written.out.find(said) != std::string::npos);
  CHECK(written.out.find(said) == written.out.rfind(said));
  CHECK(read_weights_config(launched).n_layer == 2);
  // --dp 2 alone fits neither the saved tp 2 x pp 2 nor tp 1 x pp 1: "this
  // run uses ddp on dp=2 tp=1 pp=1", then "--dp 2 x --tp 1 x --pp 1 is not
  // the world", hid the saved axes it dropped (a review helper's case).
  const std::string dp_only = std::string(train) + " --resume " + ckpt + " --steps 4 --dp 2";
  const braid::test::LaunchResult refused =
      braid::test::run_launch(job, braid::test::shell_job(4, "exec " + dp_only, job));
  INFO(refused.out << refused.err);
  CHECK(refused.status == 2);
  CHECK_THAT(refused.err, Catch::Contains("--dp 2 leaves tp x pp = 2 of the 4 ranks, and the checkpoint was written "
                                          "with tp 2 x pp 2: pass --tp 2 or --pp 2 beside it"));
  // --dp and --tp given on resume: the saved --pp 2 no longer fits beside
  // them, so it is not restored (it was, and the run was refused as
  // "--dp 2 x --tp 2 x --pp 2", a --pp never given).
  const std::string again = std::string(train) + " --resume " + ckpt + " --steps 3 --dp 2 --tp 2 --strategy zero1";
  const braid::test::LaunchResult resumed =
      braid::test::run_launch(job, braid::test::shell_job(4, "exec " + again, job));
  INFO(resumed.out << resumed.err);
  CHECK(resumed.status == 0);
  CHECK_THAT(resumed.err, Catch::Contains("this run uses zero1 on dp=2 tp=2 pp=1"));
  // --strategy zero3 alone, which runs on data parallelism only: the saved
  // --tp 2 is not restored beside it (it was, and the run was refused as
  // "zero3 does not run with --tp 2", a --tp never given).
  const std::string zero3 =
      std::string(train) + " --resume " + ckpt + " --steps 4 --strategy zero3 --micro-batches 2";
  const braid::test::LaunchResult sharded =
      braid::test::run_launch(job, braid::test::shell_job(4, "exec " + zero3, job));
  INFO(sharded.out << sharded.err);
  CHECK(sharded.status == 0);
  CHECK_THAT(sharded.err, Catch::Contains("this run uses zero3 on dp=4 tp=1 pp=1 (--strategy from the command line)"));
}

TEST_CASE("braid-train refuses a mesh that does not fit, saying what to change", "[mesh][launch]") {
  const char* train = braid_train();
  if (train == nullptr) {
    WARN("skipped: BRAID_TRAIN or BRAID_LAUNCH is not set (run through `meson test`)");
    return;
  }
  braid::test::JobDir job;
  const std::string args = std::string(train) + kTiny + " --dp 2 --tp 2";
  const braid::test::LaunchResult run = braid::test::run_launch(job, braid::test::shell_job(2, "exec " + args, job));
  CHECK(run.status == 2);
  CHECK_THAT(run.out + run.err, Catch::Contains("is not the world of 2 rank(s)"));
}

}  // namespace
}  // namespace braid::trainer
