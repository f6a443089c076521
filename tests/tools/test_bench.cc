// braid-bench end to end: the real binary under the real launcher, every
// collective checked (-c 1) on 3 ranks, the nccl-tests table and the JSON and
// CSV files; and a bad argument refused with status 2.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tests/tools/launch_harness.h"

using namespace braid::test;

namespace {

std::string bench_path() {
  const char* path = std::getenv("BRAID_BENCH");
  REQUIRE(path != nullptr);  // set by meson test
  return path;
}

std::string slurp(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The text with every run of spaces made one, so table rows can be matched
// whatever the column widths.
std::string squeezed(const std::string& text) {
  std::string out;
  for (char c : text)
    if (c != ' ' || out.empty() || out.back() != ' ') out += c;
  return out;
}

}  // namespace

TEST_CASE("braid-bench checks every collective on 3 ranks and writes JSON and CSV", "[bench]") {
  std::string coll = GENERATE("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
                              "send_recv");
  JobDir dir;
  std::string json = (dir.path() / "rows.json").string(), csv = (dir.path() / "rows.csv").string();
  LaunchedJob job(dir, {"--nproc-per-node", "3", "--", bench_path(), "--coll", coll, "-b", "8", "-e", "1M",
                        "-f", "16", "-n", "2", "-w", "1", "-c", "1", "-d", "bf16", "-o", "max", "-r", "1",
                        "--json", json, "--csv", csv});
  int status = job.wait(std::chrono::seconds(60));
  INFO(coll << "\n" << job.out() << job.err());
  REQUIRE(status == 0);
  CHECK_THAT(job.out(), Catch::Contains("Out of bounds values : 0 OK"));
  CHECK_THAT(job.out(), Catch::Contains("single-core memcpy bandwidth"));
  std::string rows = slurp(json);
  CHECK_THAT(rows, Catch::Contains("\"collective\": \"" + coll + "\""));
  CHECK_THAT(rows, Catch::Contains("\"wrong\": 0"));
  CHECK_THAT(slurp(csv), Catch::StartsWith("collective,bytes,count"));
}

TEST_CASE("braid-bench refuses a bad datatype before any work", "[bench]") {
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "1", "--", bench_path(), "-d", "f128"});
  int status = job.wait(std::chrono::seconds(20));
  INFO(job.out() << job.err());
  CHECK(status == 2);
  CHECK_THAT(job.err(), Catch::Contains("unknown datatype 'f128'"));
}

// On a GPU machine the sweep runs on device buffers and checks out; anywhere
// else the run stops at once saying why (no GPU or driver: 1; no CUDA in
// this build: 2), never a crash or a hang.
TEST_CASE("braid-bench --device cuda runs on GPU buffers or says why it cannot", "[bench][cuda]") {
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "--device", "cuda", "-b", "8", "-e", "4M",
                        "-f", "64", "-n", "2", "-w", "1", "-c", "1"});
  int status = job.wait(std::chrono::seconds(120));
  INFO(job.out() << job.err());
  if (status == 0) {
    CHECK_THAT(job.out(), Catch::Contains("device-to-device cudaMemcpy bandwidth") &&
                              Catch::Contains("Out of bounds values : 0 OK"));
  } else {
    CHECK((status == 1 || status == 2));
    CHECK_THAT(job.err(), Catch::Contains("CUDA"));
  }
}

// Fault-and-abuse cases (issue 13): a sweep from 0 bytes, reduce_scatter in
// place at sizes where a wrongly sized input overruns the heap, and output
// files that cannot be written. Each ends, with status 0 or a named error.
TEST_CASE("braid-bench -b 0 prints its rows and ends", "[bench][abuse]") {
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "0", "-e", "64", "-f", "4", "-n", "1",
                        "-w", "0", "-c", "1"});
  int status = job.wait(std::chrono::seconds(30));
  INFO(job.out() << job.err());
  REQUIRE(status == 0);
  // Rows at 0 bytes, then from one f32 element on: 4, 16 and 64 bytes.
  for (const char* row : {"] 0 0 ", "] 4 1 ", "] 16 4 ", "] 64 16 "})
    CHECK_THAT(squeezed(job.out()), Catch::Contains(row));
  CHECK_THAT(job.out(), Catch::Contains("Out of bounds values : 0 OK"));
}

TEST_CASE("braid-bench reduce_scatter in place checks out at 4 MiB and more", "[bench][abuse]") {
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "--coll", "reduce_scatter", "-b", "4M", "-e",
                        "8M", "-f", "2", "-n", "1", "-w", "0", "-c", "1"});
  int status = job.wait(std::chrono::seconds(60));
  INFO(job.out() << job.err());
  REQUIRE(status == 0);
  CHECK_THAT(squeezed(job.out()), Catch::Contains("] 8388608 1048576 "));
  CHECK_THAT(job.out(), Catch::Contains("Out of bounds values : 0 OK"));
}

TEST_CASE("braid-bench stops with a named error when --json or --csv cannot be written", "[bench][abuse]") {
  const bool json = GENERATE(true, false);
  JobDir dir;
  // A directory that does not exist, and a device that is always full.
  const std::string flag = json ? "--json" : "--csv";
  const std::string path = json ? (dir.path() / "no-such-dir" / "rows.json").string() : "/dev/full";
  const std::string cause = json ? "No such file or directory" : "No space left on device";
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "8", "-e", "64", "-n", "1", "-w", "0",
                        flag, path});
  int status = job.wait(std::chrono::seconds(30));
  INFO(job.out() << job.err());
  CHECK(status == 1);
  CHECK_THAT(job.err(), Catch::Contains(flag + " file '" + path + "'") && Catch::Contains(cause));
  CHECK_THAT(job.err(), Catch::Contains("rank 0") && Catch::Contains("exited with status 1"));
}
