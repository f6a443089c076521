// braid-bench end to end: the real binary under the real launcher, every
// collective checked (-c 1) on 3 ranks, the nccl-tests table and the JSON and
// CSV files; and a bad argument refused with status 2.
#include <sched.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

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
  // The memcpy baseline at its default size (the help test shows 256M) in
  // one run; the harness leaves it out of the others.
  const std::string baseline = coll == "all_reduce" ? "256M" : "0";
  LaunchedJob job(dir, {"--nproc-per-node", "3", "--", bench_path(), "--coll", coll, "-b", "8", "-e", "1M",
                        "-f", "16", "-n", "2", "-w", "1", "-c", "1", "-d", "bf16", "-o", "max", "-r", "1",
                        "--json", json, "--csv", csv, "--memcpy_bytes", baseline});
  int status = job.wait(std::chrono::seconds(60));
  INFO(coll << "\n" << job.out() << job.err());
  REQUIRE(status == 0);
  CHECK_THAT(job.out(), Catch::Contains("Out of bounds values : 0 OK"));
  if (coll == "all_reduce") CHECK_THAT(job.out(), Catch::Contains("single-core memcpy bandwidth"));
  std::string rows = slurp(json);
  CHECK_THAT(rows, Catch::Contains("\"collective\": \"" + coll + "\""));
  CHECK_THAT(rows, Catch::Contains("\"wrong\": 0"));
  CHECK_THAT(slurp(csv), Catch::StartsWith("collective,bytes,count"));
  // A reason quoting the call's bytes says whose they are where the size
  // column's total is not what the rule weighed (all_gather: each rank's input).
  if (coll == "all_gather") CHECK_THAT(rows, Catch::Contains(" B per rank <= 65568 B on 3 ranks"));
  if (coll == "all_reduce")
    CHECK_THAT(rows, Catch::Contains(" B <= 65568 B on 3 ranks") && !Catch::Contains("per rank"));
}

// BRAID_ALGO=direct (select.cc's forcing of the direct collective) is a
// value the configuration accepts: on registered buffers of one host every
// size runs direct and checks out; an unknown value is refused by name.
TEST_CASE("braid-bench under BRAID_ALGO=direct runs the direct collective; an unknown BRAID_ALGO is refused",
          "[bench]") {
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "--coll", "all_gather", "-b", "8", "-e", "64K",
                        "-f", "64", "-n", "2", "-w", "1", "-c", "1", "-R", "1"},
                  {{"BRAID_ALGO", "direct"}});
  int status = job.wait(std::chrono::seconds(60));
  INFO(job.out() << job.err());
  REQUIRE(status == 0);
  CHECK_THAT(squeezed(job.out()), Catch::Contains(" 8 1 f32 none -1 shm:direct "));
  CHECK_THAT(job.out(), Catch::Contains("Out of bounds values : 0 OK"));
  JobDir bad_dir;
  LaunchedJob bad(bad_dir, {"--nproc-per-node", "1", "--", bench_path(), "-b", "8", "-e", "8"},
                  {{"BRAID_ALGO", "fastest"}});
  CHECK(bad.wait(std::chrono::seconds(20)) != 0);
  CHECK_THAT(bad.out() + bad.err(), Catch::Contains("BRAID_ALGO"));
}

// braid-launch puts "[rank r] " before each line a rank writes, and braid's
// logger in the rank tagged the line with the rank too: "[rank 1]
// [12:00:00.000] [rank 1] [info] ...". The launcher tells the rank its
// prefix (BRAID_LINE_PREFIX), and the logger leaves its own tag out; with
// --log-dir, where nothing is put before the lines, the tag stays.
TEST_CASE("under braid-launch a log line names its rank once; in --log-dir files the logger names it", "[bench]") {
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "8", "-e", "8", "-n", "1"},
                  {{"BRAID_LOG_LEVEL", "info"}});
  REQUIRE(job.wait(std::chrono::seconds(60)) == 0);
  INFO(job.err());
  for (const char* rank : {"0", "1"}) {
    const std::string prefix = std::string("[rank ") + rank + "] ";
    const std::string describes = std::string("rank ") + rank + "/2 (local";
    int described = 0;
    std::istringstream lines(job.err());
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(prefix, 0) != 0) continue;
      CHECK(line.find(prefix, prefix.size()) == std::string::npos);  // the rank once
      CHECK(line.find(" [info] ") != std::string::npos);
      described += line.find(describes) != std::string::npos;
    }
    CHECK(described == 1);
  }
  // An inherited prefix is not this rank's: a rank writing to a file of its
  // own is not told one, and its logger tags its lines.
  JobDir logged;
  const auto logs = logged.path() / "logs";
  LaunchedJob to_files(logged,
                       {"--nproc-per-node", "2", "--log-dir", logs.string(), "--", bench_path(), "-b", "8", "-e", "8",
                        "-n", "1"},
                       {{"BRAID_LOG_LEVEL", "info"}, {"BRAID_LINE_PREFIX", "[rank 1] "}});
  REQUIRE(to_files.wait(std::chrono::seconds(60)) == 0);
  for (const char* rank : {"0", "1"}) {
    const std::string err = slurp(logs / (std::string("rank_") + rank + ".err"));
    INFO(err);
    CHECK_THAT(err, Catch::Contains(std::string("] [rank ") + rank + "] [info] rank " + rank + "/2 (local"));
  }
}

// libbraid_comm.so named libibverbs.so.1, so that no program of braid
// started on a machine without rdma-core (h47). The transport is now a
// library of its own, loaded at the first look for RDMA
// (comm/transport/ibverbs/plugin.h). Here libbraid_comm and that library
// are copied into a folder with a libibverbs.so.1 that is no library at all,
// ahead of the build's on LD_LIBRARY_PATH: tcp runs, and BRAID_TRANSPORT=
// ibverbs is refused naming the library and why it did not load.
TEST_CASE("braid-bench runs where libibverbs cannot be loaded, and BRAID_TRANSPORT=ibverbs says why", "[bench]") {
  const auto build = std::filesystem::path(bench_path()).parent_path().parent_path();
  if (!std::filesystem::exists(build / "comm" / "libbraid_comm_ibverbs.so")) {
    WARN("skipped: this build has no libibverbs (scripts/setup.sh installs libibverbs-dev)");
    return;
  }
  JobDir libs;
  for (const char* name : {"libbraid_comm.so.0", "libbraid_comm_ibverbs.so"})
    std::filesystem::copy_file(build / "comm" / name, libs.path() / name);
  std::ofstream(libs.path() / "libibverbs.so.1") << "not a shared library\n";
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "8", "-e", "64K", "-f", "64", "-n", "2"},
                  {{"LD_LIBRARY_PATH", libs.path().string()}, {"BRAID_TRANSPORT", "tcp"}});
  const int status = job.wait(std::chrono::seconds(60));
  INFO(job.out() << job.err());
  CHECK(status == 0);
  CHECK_THAT(job.out(), Catch::Contains("Out of bounds values : 0 OK"));
  JobDir ib_dir;
  LaunchedJob ib(ib_dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "8", "-e", "8"},
                 {{"LD_LIBRARY_PATH", libs.path().string()}, {"BRAID_TRANSPORT", "ibverbs"}});
  const int ib_status = ib.wait(std::chrono::seconds(60));
  INFO(ib.out() << ib.err());
  CHECK(ib_status != 0);
  // The copy was loaded (its folder is named), and failed on the fake verbs library.
  CHECK_THAT(ib.out() + ib.err(), Catch::Contains((libs.path() / "libbraid_comm_ibverbs.so").string() +
                                                  ") cannot be loaded") &&
                                      Catch::Contains("libibverbs.so.1") && Catch::Contains("install libibverbs1"));
}

// A socket buffer smaller than one loopback segment left TCP moving data only
// on its persist timer: a 256 KiB all_reduce took seconds at 8K and a minute
// at 4K, and nothing timed out. Such a size is refused by name; the smallest
// allowed one runs at full speed (a 256 KiB sweep of 3 iterations ends well
// inside the 30 s it is given; at 16K the old code needed 1.6 s of them).
TEST_CASE("braid-bench on tcp refuses a socket buffer below 64K and runs at 64K", "[bench][abuse]") {
  JobDir bad_dir;
  LaunchedJob bad(bad_dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "256K", "-e", "256K", "-n", "3"},
                  {{"BRAID_TRANSPORT", "tcp"}, {"BRAID_SOCKET_BUFFER_BYTES", "32K"}});
  int bad_status = bad.wait(std::chrono::seconds(30));
  INFO(bad.out() << bad.err());
  CHECK(bad_status != 0);
  CHECK_THAT(bad.out() + bad.err(), Catch::Contains("BRAID_SOCKET_BUFFER_BYTES='32K'") &&
                                        Catch::Contains("between 65536 and"));
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "256K", "-e", "256K", "-n", "3"},
                  {{"BRAID_TRANSPORT", "tcp"}, {"BRAID_SOCKET_BUFFER_BYTES", "64K"}});
  int status = job.wait(std::chrono::seconds(30));
  INFO(job.out() << job.err());
  CHECK(status == 0);
  CHECK_THAT(job.out(), Catch::Contains("Out of bounds values : 0 OK"));
}

TEST_CASE("braid-bench refuses a bad datatype before any work", "[bench]") {
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "1", "--", bench_path(), "-d", "f128"});
  int status = job.wait(std::chrono::seconds(20));
  INFO(job.out() << job.err());
  CHECK(status == 2);
  CHECK_THAT(job.err(), Catch::Contains("unknown datatype 'f128'"));
  // A bitwise op of a floating-point type alone is refused; under -d all it
  // runs on the integer types.
  LaunchedJob bitwise(dir, {"--nproc-per-node", "1", "--", bench_path(), "-o", "bxor", "-d", "bf16"});
  CHECK(bitwise.wait(std::chrono::seconds(20)) == 2);
  INFO(bitwise.err());
  CHECK_THAT(bitwise.err(), Catch::Contains("-o bxor is a bitwise operator, for the integer types"));
  // A collective that reduces nothing ignores the op (it aborted computing
  // its expected values as bitwise reductions of f32).
  LaunchedJob moving(dir, {"--nproc-per-node", "2", "--", bench_path(), "-o", "band", "--coll", "broadcast", "-b", "8",
                           "-e", "64"});
  CHECK(moving.wait(std::chrono::seconds(30)) == 0);
  INFO(moving.out() << moving.err());
  CHECK_THAT(moving.out(), Catch::Contains("Out of bounds values : 0 OK"));
  // -T below BRAID_TIMEOUT's 1 ms ran as 1 ms, without a word.
  LaunchedJob short_timeout(dir, {"--nproc-per-node", "1", "--", bench_path(), "-T", "0.0001"});
  CHECK(short_timeout.wait(std::chrono::seconds(20)) == 2);
  INFO(short_timeout.err());
  CHECK_THAT(short_timeout.err(), Catch::Contains("seconds from 0.001 to 1e7, not 0.0001"));
}

// On a GPU machine the sweep runs on device buffers and checks out; anywhere
// else the run stops at once saying why (no GPU or driver: 1; no CUDA in
// this build: 2), never a crash or a hang.
TEST_CASE("braid-bench --device cuda runs on GPU buffers or says why it cannot", "[bench][cuda]") {
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "--device", "cuda", "-b", "8", "-e", "4M",
                        "-f", "64", "-n", "2", "-w", "1", "-c", "1", "--memcpy_bytes", "256M"});
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

// A reduce has no output off its root, but its input must stay: a
// non-root's send buffer went unchecked (a review helper's case). A library
// that flips a bit of it after each call (fault_shim.cc) is caught there,
// out of place; in place, where a non-root's buffer is the library's, it
// is not looked at.
TEST_CASE("braid-bench counts a non-root reduce that changed its send buffer", "[bench]") {
  const char* shim = std::getenv("BRAID_FAULT_SHIM");
  REQUIRE(shim != nullptr);  // set by meson test
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "--coll", "reduce", "-b", "64", "-e", "64",
                        "-n", "1", "-w", "0", "-c", "1", "-r", "0", "--memcpy_bytes", "0"},
                  {{"LD_PRELOAD", std::string(shim)}, {"FAULT_SHIM", "reduce_send"}});
  const int status = job.wait(std::chrono::seconds(30));
  INFO(job.out() << job.err());
  CHECK(status != 0);
  CHECK_THAT(job.out(), Catch::Contains("Out of bounds values : 1 FAILED"));
}

// Once a peer had stopped (SIGSTOP) and the call waiting for it timed
// out, every call issued after it was refused one at a time: with a large
// -n braid-bench went on issuing them at full CPU for minutes after the
// error (a review helper's case). It stops within a few calls.
TEST_CASE("braid-bench stops soon after a peer times out, whatever -n", "[bench][abuse]") {
  JobDir dir;
  const std::string bench = bench_path() + " -b 8 -e 8 -n 100000000 -w 0 -c 0 --memcpy_bytes 0";
  const std::string script = "if [ \"$BRAID_RANK\" = 1 ]; then " + bench +
                             " & pid=$!; sleep 2; kill -STOP $pid; wait $pid; exit $?; fi; exec " + bench;
  const auto started = std::chrono::steady_clock::now();
  const LaunchResult run = run_launch(dir, shell_job(2, script, dir), {{"BRAID_TIMEOUT", "3"}});
  const auto took = std::chrono::steady_clock::now() - started;
  INFO(run.out << run.err);
  CHECK(run.status == 1);
  CHECK_THAT(run.err, Catch::Contains("rank 1"));
  CHECK(took < std::chrono::seconds(20));
}

// The --json file failed to write and the --csv file was never tried: it
// was left behind empty, and only the first was named.
TEST_CASE("braid-bench writes --csv when --json cannot be written, and names the one that failed", "[bench][abuse]") {
  JobDir dir;
  const std::string csv = (dir.path() / "rows.csv").string();
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "8", "-e", "64", "-n", "1", "-w", "0",
                        "--json", "/dev/full", "--csv", csv});
  int status = job.wait(std::chrono::seconds(30));
  INFO(job.out() << job.err());
  CHECK(status == 1);
  CHECK_THAT(job.err(), Catch::Contains("--json file '/dev/full'") && Catch::Contains("No space left on device"));
  std::ifstream in(csv);
  std::string header;
  CHECK(std::getline(in, header));
  CHECK_THAT(header, Catch::StartsWith("collective,bytes,count"));
  CHECK(std::filesystem::exists("/dev/full"));  // a failed file is removed only when it is a regular one
}

// nccl-tests' flags and output, as its users read them (issue 17).
TEST_CASE("braid-bench: -d all -o all run every dtype and op, and the JSON holds the run", "[bench]") {
  JobDir dir;
  std::string json = (dir.path() / "run.json").string(), csv = (dir.path() / "run.csv").string();
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "8", "-e", "64", "-f", "8", "-d", "all",
                        "-o", "all", "-n", "3", "-w", "1", "-c", "1", "-J", json, "--csv", csv});
  int status = job.wait(std::chrono::seconds(60));
  INFO(job.out() << job.err());
  REQUIRE(status == 0);
  CHECK_THAT(job.out(), Catch::Contains("out-of-place") && Catch::Contains("in-place"));
  CHECK_THAT(job.out(), Catch::Contains("Out of bounds values : 0 OK"));
  const auto run = nlohmann::json::parse(slurp(json));
  // dtypes x ops x sizes: the 5 arithmetic ops of 8 dtypes, the 3 bitwise
  // ones of the 4 integer dtypes only
  constexpr std::size_t kRows = (8 * 5 + 4 * 3) * 2;
  CHECK(run["rows"].size() == kRows);
  CHECK(run["out_of_bounds"] == 0);
  CHECK(run["ranks"] == 2);
  CHECK(run["parameters"]["datatypes"].size() == 8);
  CHECK(run["parameters"]["ops"].size() == 8);
  CHECK(run["transports_from_rank_0"][1]["transport"] == "shm");
  CHECK(run["transports_from_rank_0"][0]["transport"] == "self");
  CHECK(run.contains("host"));
  CHECK(run.contains("version"));
  CHECK(run["average_busbw_gbps"].get<double>() > 0);
  const std::string table = slurp(csv);
  CHECK_THAT(table, Catch::StartsWith("collective,bytes,count"));
  CHECK_THAT(table, Catch::Contains("oop_busbw_per_memcpy") && Catch::Contains("memcpy_gbps") &&
                        Catch::Contains("algorithm_reason"));
  CHECK(std::count(table.begin(), table.end(), '\n') == 1 + kRows);
}

// -e past what memory holds ran the sweep into the OOM killer (a rank
// SIGKILLed after the 256 MiB row of -e 1T; found by a review helper). As
// nccl-tests does, the sweep now ends at the largest size that fits, said
// in a comment line, and a -b that does not fit is refused. An
// address-space limit (ulimit -v, per rank) plays the small machine.
TEST_CASE("braid-bench lowers -e to what memory holds and refuses a -b that does not fit", "[bench]") {
  JobDir dir;
  const char* launch = std::getenv("BRAID_LAUNCH");
  REQUIRE(launch != nullptr);
  auto run = [&](const std::string& sizes) {
    const std::string command = "ulimit -v 2000000; exec " + std::string(launch) + " -n 2 -- " + bench_path() + " " +
                                sizes + " -n 1 -w 0 -c 0 > " + (dir.path() / "out").string() + " 2> " +
                                (dir.path() / "err").string();
    const int status = std::system(("bash -c '" + command + "'").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  CHECK(run("-b 1M -e 1T") == 0);
  std::string out = slurp(dir.path() / "out");
  INFO(out << slurp(dir.path() / "err"));
  CHECK_THAT(out, Catch::Contains("# -e 1099511627776 lowered to ") &&
                      Catch::Contains("(the address-space limit (ulimit -v) less what this process maps)"));
  CHECK_THAT(squeezed(out), Catch::Contains("] 1048576 262144 f32 sum") && !Catch::Contains("] 1073741824 "));
  CHECK(run("-b 2G -e 2G") == 2);
  CHECK_THAT(slurp(dir.path() / "err"),
             Catch::Contains("-b 2147483648 needs 4.06 GiB of buffers and scratch per rank, more than ") &&
                                            Catch::Contains("lower -b"));
  // The memcpy baseline took 512 MiB before any check: 8-byte calls under a
  // 500 MB limit failed "out of memory allocating 268435456 bytes". It is
  // lowered, and says so, in its output and in the JSON's parameters (which
  // gave the size asked for; a review helper's case).
  const std::string json = (dir.path() / "small.json").string();
  const std::string small = "ulimit -v 500000; exec " + bench_path() + " -b 8 -e 8 -n 1 -w 0 -J " + json + " > " +
                            (dir.path() / "out").string() + " 2> " + (dir.path() / "err").string();
  const int status = std::system(("bash -c '" + small + "'").c_str());
  INFO(slurp(dir.path() / "out") << slurp(dir.path() / "err"));
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK_THAT(slurp(dir.path() / "out"), Catch::Contains("# --memcpy_bytes 268435456 lowered to "));
  const auto copied = nlohmann::json::parse(slurp(json))["parameters"]["memcpy_bytes"].get<std::size_t>();
  CHECK(copied < std::size_t{256} << 20);
  CHECK(copied >= std::size_t{1} << 20);
}

TEST_CASE("braid-bench: -i, -N, -m, -z, -C, -a and -T keep their nccl-tests meanings", "[bench]") {
  JobDir dir;
  std::string json = (dir.path() / "run.json").string();
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "1K", "-e", "4K", "-i", "1K", "-N", "2",
                        "-m", "3", "-z", "1", "-C", "1", "-a", "0", "-T", "29.5", "-n", "3", "-w", "1", "-J", json});
  int status = job.wait(std::chrono::seconds(60));
  INFO(job.out() << job.err());
  REQUIRE(status == 0);
  const auto run = nlohmann::json::parse(slurp(json));
  std::vector<std::size_t> sizes;
  for (const auto& row : run["rows"]) sizes.push_back(row["bytes"].get<std::size_t>());
  CHECK(sizes == std::vector<std::size_t>{1024, 2048, 3072, 4096, 1024, 2048, 3072, 4096});  // -i 1K, two cycles
  CHECK(run["parameters"]["agg_iters"] == 3);
  CHECK(run["parameters"]["average"] == 0);
  CHECK(run["parameters"]["timeout_s"] == 29.5);  // fractions of a second too, as BRAID_TIMEOUT
  CHECK(run["out_of_bounds"] == 0);
}

// -b 0 -i 8 stepped from one element (0, 4, 12, ...: never -e); -c 0
// printed "#wrong 0" and "OK" though nothing was checked, and send_recv's
// in-place columns were copies of the out-of-place ones.
TEST_CASE("braid-bench: -b 0 -i steps from 0; unchecked and unmeasured columns read N/A", "[bench]") {
  JobDir dir;
  std::string json = (dir.path() / "run.json").string();
  LaunchedJob steps(dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "0", "-e", "32", "-i", "8", "-n", "1",
                          "-w", "0", "-J", json});
  REQUIRE(steps.wait(std::chrono::seconds(30)) == 0);
  std::vector<std::size_t> sizes;
  const auto stepped = nlohmann::json::parse(slurp(json));
  for (const auto& row : stepped["rows"]) sizes.push_back(row["bytes"].get<std::size_t>());
  CHECK(sizes == std::vector<std::size_t>{0, 8, 16, 24, 32});

  // A measured baseline (the harness leaves it out), so that /mcpy reads a
  // number and the N/A below is #wrong's.
  LaunchedJob unchecked(dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "64", "-e", "64", "-n", "1", "-w",
                              "0", "-c", "0", "-J", json, "--memcpy_bytes", "4K"});
  REQUIRE(unchecked.wait(std::chrono::seconds(30)) == 0);
  INFO(unchecked.out());
  CHECK_THAT(squeezed(unchecked.out()), Catch::Contains(" N/A "));
  const auto unchecked_run = nlohmann::json::parse(slurp(json));
  const auto row = unchecked_run["rows"][0];
  CHECK(row["out_of_place"]["wrong"].is_null());
  CHECK(row["in_place"]["wrong"].is_null());
  // The summary said "0 OK" and the JSON 0, of a run that checked nothing.
  CHECK_THAT(unchecked.out(), Catch::Contains("Out of bounds values : N/A (-c 0)"));
  CHECK(unchecked_run["out_of_bounds"].is_null());

  std::string csv = (dir.path() / "rows.csv").string();
  LaunchedJob ring(dir, {"--nproc-per-node", "2", "--", bench_path(), "--coll", "send_recv", "-b", "64", "-e", "64",
                         "-n", "1", "-w", "0", "-J", json, "--csv", csv});
  REQUIRE(ring.wait(std::chrono::seconds(30)) == 0);
  INFO(ring.out());
  CHECK_THAT(squeezed(ring.out()), Catch::Contains(" 0 N/A N/A N/A N/A N/A"));
  const auto shift = nlohmann::json::parse(slurp(json))["rows"][0];
  CHECK(shift["out_of_place"]["wrong"] == 0);
  CHECK(shift["in_place"].is_null());
  CHECK_THAT(slurp(csv), Catch::Contains(",0,,,,,,"));

  // One rank printed the table's header, then failed in its first send to itself.
  LaunchedJob alone(dir, {"--nproc-per-node", "1", "--", bench_path(), "--coll", "send_recv"});
  CHECK(alone.wait(std::chrono::seconds(30)) == 2);
  INFO(alone.out() << alone.err());
  CHECK_THAT(alone.err(), Catch::Contains("--coll send_recv shifts a ring of ranks: it needs 2 ranks or more"));
  CHECK_THAT(alone.out(), !Catch::Contains("(elements)"));
}

namespace {

// braid-bench on one rank with `flags` exits 2, its output matching `says`.
template <class Matcher>
void check_refused(const std::vector<std::string>& flags, const Matcher& says) {
  JobDir dir;
  std::vector<std::string> args{"--nproc-per-node", "1", "--", bench_path()};
  args.insert(args.end(), flags.begin(), flags.end());
  LaunchedJob job(dir, args);
  int status = job.wait(std::chrono::seconds(20));
  INFO(flags[0] << ": " << job.out() << job.err());
  CHECK(status == 2);
  CHECK_THAT(job.err() + job.out(), says);
}

}  // namespace

// The memcpy baseline page-faults 512 MiB before the first call: seconds in
// the RDMA VM's emulated CPU, where every bench run paid them.
// --memcpy_bytes 0 measures none (/mcpy N/A, null in JSON, empty in CSV); a
// size sets the copies' size, and one too small to measure memory is
// refused.
TEST_CASE("braid-bench: --memcpy_bytes sizes the memcpy baseline, 0 measures none", "[bench]") {
  JobDir dir;
  const std::string json = (dir.path() / "run.json").string(), csv = (dir.path() / "rows.csv").string();
  LaunchedJob none(dir, {"--nproc-per-node", "2", "--", bench_path(), "-b", "64", "-e", "64", "-n", "1", "-w", "0",
                         "--memcpy_bytes", "0", "-J", json, "--csv", csv});
  REQUIRE(none.wait(std::chrono::seconds(30)) == 0);
  INFO(none.out());
  CHECK_THAT(none.out(), Catch::Contains("no memcpy baseline measured (--memcpy_bytes 0): /mcpy reads N/A"));
  CHECK_THAT(squeezed(none.out()), Catch::Contains(" N/A 0 ") && !Catch::Contains("inf"));
  CHECK_THAT(none.out(), Catch::Contains("# Avg bus bandwidth") && !Catch::Contains("x memcpy"));
  const auto run = nlohmann::json::parse(slurp(json));
  CHECK(run["memcpy_gbps"].is_null());
  CHECK(run["parameters"]["memcpy_bytes"] == 0);
  CHECK(run["rows"][0]["out_of_place"]["busbw_per_memcpy"].is_null());
  CHECK(run["rows"][0]["memcpy_gbps"].is_null());
  const std::string rows = slurp(csv);
  CHECK(rows.substr(rows.size() - 4) == ",0,\n");  // ip_wrong, then an empty memcpy_gbps

  LaunchedJob sized(dir, {"--nproc-per-node", "1", "--", bench_path(), "-b", "64", "-e", "64", "-n", "1", "-w", "0",
                          "--memcpy_bytes", "4M", "-J", json});
  REQUIRE(sized.wait(std::chrono::seconds(30)) == 0);
  INFO(sized.out());
  const auto measured = nlohmann::json::parse(slurp(json));
  CHECK(measured["parameters"]["memcpy_bytes"] == 4u << 20);
  CHECK(measured["memcpy_gbps"].get<double>() > 0);
  CHECK_THAT(sized.out(), Catch::Contains("single-core memcpy bandwidth:") && Catch::Contains("x memcpy)"));

  check_refused({"--memcpy_bytes", "100"}, Catch::Contains("--memcpy_bytes 100: give 0 (no baseline) or at least 4K"));
}

TEST_CASE("braid-bench: nccl-tests flags with no meaning here are refused by name", "[bench]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-t", "2"}, "one rank per process"},  {{"-g", "2"}, "one device"},
      {{"-p", "1"}, "nothing to initialize"}, {{"-G", "1"}, "CUDA graph"},
      {{"-y", "1"}, "needs --device cuda"}};
  for (const auto& [flags, words] : cases) check_refused(flags, Catch::Contains(words));
  JobDir dir;
  LaunchedJob help(dir, {"--nproc-per-node", "1", "--", bench_path(), "--help"});
  REQUIRE(help.wait(std::chrono::seconds(20)) == 0);
  CHECK_THAT(squeezed(help.out()), Catch::Contains("-n,--iters INT:INT in [1 - 2147483647]=20"));  // defaults shown
  CHECK_THAT(squeezed(help.out()), Catch::Contains("--memcpy_bytes TEXT=256M"));
}

// Found by a review helper against nccl-tests: -f beside -i was dropped
// without a word; -N 0 with --json left an empty file and grew rank 0's
// memory row by row; a flag given twice was refused where nccl-tests takes
// the last; -C 1's times were labelled as completion times.
TEST_CASE("braid-bench: -i with -f and -N 0 with --json are refused, a repeated flag takes the last, -C labels cputime",
          "[bench]") {
  JobDir dir;
  const std::string json = (dir.path() / "n0.json").string();
  check_refused({"-b", "8", "-e", "40", "-i", "8", "-f", "4"}, Catch::Contains("-i 8 and -f 4 both set the step"));
  check_refused({"-N", "0", "-J", json}, Catch::Contains("-N 0 runs the sweep until stopped"));
  CHECK_FALSE(std::filesystem::exists(json));
  LaunchedJob job(dir, {"--nproc-per-node", "1", "--", bench_path(), "-b", "8", "-e", "8", "-n", "4", "-n", "1",
                        "-w", "0", "-C", "1", "-J", json});
  REQUIRE(job.wait(std::chrono::seconds(30)) == 0);
  INFO(job.out() << job.err());
  CHECK_THAT(job.out(), Catch::Contains(" cputime "));
  CHECK(nlohmann::json::parse(slurp(json))["parameters"]["iters"] == 1);
}

// Found by a review helper: a refused or killed run emptied an earlier
// run's --json and --csv files (opened, truncated, before any check); both
// flags naming one file wrote the CSV over the JSON and exited 0; `-J ""`
// wrote nothing without a word; -i 1 up to -e 1G listed 2^30 sizes and
// aborted in std::bad_alloc.
TEST_CASE("braid-bench: an earlier run's files outlive a refused run; --json and --csv need files of their own",
          "[bench][abuse]") {
  JobDir dir;
  const std::string json = (dir.path() / "prev.json").string(), csv = (dir.path() / "prev.csv").string();
  std::ofstream(json) << "{\"previous\": \"results\"}\n";
  std::ofstream(csv) << "old\n";
  check_refused({"-o", "band", "-d", "f32", "-J", json, "--csv", csv}, Catch::Contains("bitwise operator"));
  CHECK(slurp(json) == "{\"previous\": \"results\"}\n");
  CHECK(slurp(csv) == "old\n");
  check_refused({"-b", "8", "-e", "8", "-J", json, "--csv", (dir.path() / "." / "prev.json").string()},
                Catch::Contains("--json and --csv both name"));
  check_refused({"-b", "8", "-e", "8", "-J", ""}, Catch::Contains("--json is empty"));
  check_refused({"-b", "8", "-e", "8", "--csv", ""}, Catch::Contains("--csv is empty"));
  check_refused({"-b", "1", "-e", "1G", "-i", "1"}, Catch::Contains("is 1073741824 sizes, more than 100000"));
  // A run that writes them replaces them whole, its permissions kept.
  std::filesystem::permissions(csv, std::filesystem::perms(0640));
  LaunchedJob job(dir, {"--nproc-per-node", "1", "--", bench_path(), "-b", "8", "-e", "8", "-n", "1", "-w", "0",
                        "-J", json, "--csv", csv});
  REQUIRE(job.wait(std::chrono::seconds(30)) == 0);
  CHECK(nlohmann::json::parse(slurp(json))["rows"].size() == 1);
  CHECK_THAT(slurp(csv), Catch::StartsWith("collective,bytes,count"));
  CHECK(std::filesystem::status(csv).permissions() == std::filesystem::perms(0640));
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))  // no staged file left beside them
    CHECK_THAT(entry.path().filename().string(), !Catch::StartsWith("prev.json.") && !Catch::StartsWith("prev.csv."));
}

// CLI11's own positive-number check said "Value 0 not in range 0.000000 to
// 1797693134862315708...", the largest double in 310 digits.
TEST_CASE("braid-bench: a count out of range names its range plainly", "[bench]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-n", "0"}, "--iters: Value 0 not in range 1 to 2147483647"},
      {{"-m", "0"}, "--agg_iters: Value 0 not in range 1 to 2147483647"},
      {{"-w", "-1"}, "--warmup_iters: Value -1 not in range 0 to 2147483647"},
      // CLI11 read "010" as 8 and "0x2" as 2 (base 0); braid-train's flags
      // were decimal already.
      {{"-w", "0x2"}, "--warmup_iters: must be a whole number"},
      {{"-n", "1e3"}, "--iters: must be a whole number in decimal digits"},
      {{"-f", "0x4"}, "--stepfactor: must be a whole number"},  // the one integer flag CLI11 still read in base 0
      // Buffers of 2^64 - 1 bytes, rounded up, wrapped to 0: SIGSEGV.
      {{"-b", "18446744073709551615", "-e", "18446744073709551615"}, "-e and -i must not exceed 256 TiB"}};
  for (const auto& [flags, words] : cases) check_refused(flags, Catch::Contains(words) && !Catch::Contains("179769"));
}

// Whether the ranks of a host may spin is decided on the CPUs their
// affinities name together, not on each rank's own: ranks bound one per core
// (as mpirun --bind-to core or srun --cpu-bind leave them) see one CPU each
// and still spin, ranks bound to one shared core do not. Read in the info
// log that every communicator prints.
TEST_CASE("ranks bound one per core spin, ranks bound to one core yield", "[bench]") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE && cpus.size() < 2; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  if (cpus.size() < 2) {
    WARN("one CPU allowed here: nothing to bind apart");
    return;
  }
  const bool apart = GENERATE(true, false);
  const std::string second = std::to_string(apart ? cpus[1] : cpus[0]);
  const std::string bind = "exec taskset -c \"$([ \"$RANK\" = 0 ] && echo " + std::to_string(cpus[0]) + " || echo " +
                           second + ")\" \"$0\" \"$@\"";
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", "sh", "-c", bind, bench_path(), "--coll", "all_reduce", "-b", "8",
                        "-e", "8", "-n", "20", "-w", "2", "-c", "1"},
                  {{"BRAID_LOG_LEVEL", "info"}});
  const int status = job.wait(std::chrono::seconds(60));
  const std::string log = job.out() + job.err();
  INFO(log);
  REQUIRE(status == 0);
  CHECK_THAT(log, Catch::Contains("Out of bounds values : 0 OK"));
  // The placement each rank starts with, logged at info (and only then
  // looked up: hwloc's topology takes tens of ms per communicator).
  CHECK_THAT(log, Catch::Contains(", cores " + std::to_string(cpus[0])) && Catch::Contains("NUMA node(s) "));
  if (apart) {
    CHECK_THAT(log, Catch::Contains("2 rank(s) of this host on 2 CPU(s) (" + std::to_string(cpus[0]) +
                                    "): waits spin up to BRAID_SPIN_US"));
    CHECK_THAT(log, Catch::Contains("2 rank(s) of this host on 2 CPU(s) (" + second + "): waits spin up to"));
  } else {
    CHECK_THAT(log, Catch::Contains("2 rank(s) of this host on 1 CPU(s) (" + second +
                                    "): waits yield and sleep (oversubscribed)"));
    CHECK(log.find("waits spin") == std::string::npos);
  }
}

// A communicator's id (in its log lines and its message headers) is its
// store prefix within its job: two jobs' worlds, or two torch groups (each
// its own job), are both "braid/world" and logged as one id before.
TEST_CASE("two jobs' worlds have different communicator ids, alike on their ranks", "[bench]") {
  auto ids_of_a_job = [] {
    JobDir dir;
    LaunchedJob job(dir, {"--nproc-per-node", "2", "--", bench_path(), "--coll", "all_reduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0"},
                    {{"BRAID_LOG_LEVEL", "info"}});
    const int status = job.wait(std::chrono::seconds(60));
    const std::string log = job.out() + job.err();
    INFO(log);
    REQUIRE(status == 0);
    std::vector<std::string> ids;
    for (std::size_t at = 0; (at = log.find(" (braid/world): rank ", at)) != std::string::npos; ++at)
      ids.push_back(log.substr(at - 8, 8));
    REQUIRE(ids.size() == 2);
    CHECK(ids[0] == ids[1]);
    return ids[0];
  };
  const std::string first = ids_of_a_job(), second = ids_of_a_job();
  CHECK(first != second);
}
