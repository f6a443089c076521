// braid-check end to end on this host: the real binary under the real
// launcher, the collective grid with every element checked, over shm and
// tcp (the RDMA VM runs it over ibverbs), the barrier's ordering check in a
// folder, and a mismatched call that every rank must report by name.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/tools/launch_harness.h"

using namespace braid::test;
namespace fs = std::filesystem;

namespace {

std::string check_path() {
  const char* path = std::getenv("BRAID_CHECK");
  REQUIRE(path != nullptr);  // set by meson test
  return path;
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

// Marks of an earlier run in the barrier folder must not stand in for a rank
// that has not arrived, and the run leaves none of its own behind.
TEST_CASE("braid-check runs its grid clean over shm and tcp and leaves its barrier folder as it found it",
          "[check]") {
  for (const char* transport : {"shm", "tcp"}) {
    INFO("transport " << transport);
    JobDir dir;
    const fs::path barriers = dir.path() / "barriers";
    fs::create_directory(barriers);
    std::ofstream(barriers / "barrier.0.1").put('\n');  // a mark as the old naming had it
    LaunchedJob job(dir, {"--nproc-per-node", "3", "--", check_path(), "--barrier-dir", barriers.string(),
                          "--large", "100000"},
                    {{"BRAID_TRANSPORT", transport}});
    int status = job.wait(std::chrono::seconds(120));
    INFO(job.out() << job.err());
    CHECK(status == 0);
    CHECK(count_of(job.out(), "cases, 0 wrong (0 wrong elements)") == 3);
    CHECK(count_of(job.out(), ":" + std::string(transport)) == 6);  // each rank names both peers' transport
    std::size_t left = 0;
    for (const auto& entry : fs::directory_iterator(barriers)) left += entry.path().filename() != "barrier.0.1";
    CHECK(left == 0);
  }
}

TEST_CASE("braid-check refuses a --barrier-dir that is not a folder instead of reporting a wrong barrier",
          "[check]") {
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", check_path(), "--barrier-dir", (dir.path() / "none").string()});
  int status = job.wait(std::chrono::seconds(60));
  INFO(job.out() << job.err());
  CHECK(status == 2);
  CHECK_THAT(job.out() + job.err(), Catch::Contains("--barrier-dir: Directory does not exist"));
  CHECK_THAT(job.out(), !Catch::Contains("WRONG"));
}

TEST_CASE("braid-check: a call whose count or kind differs across ranks fails on every rank naming the mismatch",
          "[check]") {
  for (const char* transport : {"shm", "tcp"})
    for (const char* kind : {"count", "kind"}) {
      INFO("transport " << transport << ", --expect-mismatch " << kind);
      JobDir dir;
      LaunchedJob job(dir, {"--nproc-per-node", "3", "--", check_path(), "--expect-mismatch", kind},
                      {{"BRAID_TRANSPORT", transport}});
      int status = job.wait(std::chrono::seconds(60));
      INFO(job.out() << job.err());
      CHECK(status == 0);
      CHECK(count_of(job.out(), "failed as expected") == 3);
      CHECK(count_of(job.out(), "mismatched collectives: rank ") >= 3);
    }
}

// A wrong --expect-transport was printed but dropped in the mismatch mode
// (exit 0); --counts past memory aborted with an uncaught bad_alloc.
TEST_CASE("braid-check: a wrong transport fails the mismatch mode; counts past memory are a usage error", "[check]") {
  JobDir dir;
  LaunchedJob wrong(dir, {"--nproc-per-node", "2", "--", check_path(), "--expect-transport", "ibverbs",
                          "--expect-mismatch", "kind"},
                    {{"BRAID_TRANSPORT", "shm"}});
  const int status = wrong.wait(std::chrono::seconds(60));
  INFO(wrong.out() << wrong.err());
  CHECK(status == 1);
  CHECK_THAT(wrong.out() + wrong.err(), Catch::Contains("WRONG transport to rank"));

  LaunchedJob huge(dir, {"--nproc-per-node", "2", "--", check_path(), "--counts", "9999999999999"});
  const int huge_status = huge.wait(std::chrono::seconds(60));
  INFO(huge.out() << huge.err());
  CHECK(huge_status == 2);
  CHECK_THAT(huge.err(), Catch::Contains("out of memory for the buffers of the grid; lower --counts or --large"));

  // 2^62 elements made buffers of 64 bytes (the size wrapped), written
  // past: SIGSEGV. "-1" was read as 2^64 - 1, "010" as 8.
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--large", "4611686018427387904"}, "--large and --mismatch-count must not exceed 2^45"},
      {{"--counts", "1,-1"}, "--counts: must be a whole number from 0"},
      {{"--counts", "0x10"}, "--counts: must be a whole number in decimal digits"}};
  for (const auto& [flags, words] : refused) {
    std::vector<std::string> args = {"--nproc-per-node", "1", "--", check_path()};
    args.insert(args.end(), flags.begin(), flags.end());
    LaunchedJob job(dir, args);
    const int rc = job.wait(std::chrono::seconds(60));
    INFO(flags.front() << " " << flags.back() << "\n" << job.out() << job.err());
    CHECK(rc == 2);
    CHECK_THAT(job.err(), Catch::Contains(words));
  }
}

// The checker checked: a library that breaks one promise (fault_shim.cc)
// must be reported, on the rank that sees it, with exit status 1. A write
// past the end of a buffer, an f32 result through bf16's precision and a
// write into a non-root's reduce receive buffer each read "0 wrong" (a
// review helper's cases).
TEST_CASE("braid-check reports a library that writes past a buffer, loses precision or writes an unused buffer",
          "[check]") {
  const char* shim = std::getenv("BRAID_FAULT_SHIM");
  REQUIRE(shim != nullptr);  // set by meson test
  struct Fault {
    const char* name;
    std::vector<std::string> flags;
    std::string report;
  };
  const std::vector<Fault> faults = {
      {"all_reduce_overrun", {"--colls", "all_reduce", "--dtypes", "f32,i64"},
       "recv: 8 of the 64 bytes past its end were written"},
      {"all_reduce_bf16", {"--colls", "all_reduce", "--dtypes", "f32"}, "WRONG all_reduce f32 sum count 97"},
      {"reduce_recv", {"--colls", "reduce", "--dtypes", "i64"}, "recv (not the root's: unused)[0]: written (0)"},
  };
  for (const Fault& f : faults) {
    INFO(f.name);
    JobDir dir;
    std::vector<std::string> args = {"--nproc-per-node", "2", "--", check_path(), "--counts", "1,97", "--ops", "sum"};
    args.insert(args.end(), f.flags.begin(), f.flags.end());
    LaunchedJob job(dir, args, {{"LD_PRELOAD", std::string(shim)}, {"FAULT_SHIM", f.name}});
    const int status = job.wait(std::chrono::seconds(60));
    INFO(job.out() << job.err());
    CHECK(status == 1);
    CHECK_THAT(job.out(), Catch::Contains(f.report));
  }
  // The same run with the real library alone is clean.
  JobDir dir;
  LaunchedJob clean(dir, {"--nproc-per-node", "2", "--", check_path(), "--counts", "1,97", "--ops", "sum", "--colls",
                          "all_reduce,reduce"},
                    {{"LD_PRELOAD", std::string(shim)}});
  CHECK(clean.wait(std::chrono::seconds(60)) == 0);
}

// Without --barrier-dir a barrier runs but nothing shows whether it held
// the ranks: it printed "ok barrier" and counted as a case checked. On one
// process, --expect-mismatch has no peer to differ from: its call
// completed and was reported as braid's fault.
TEST_CASE("braid-check says a barrier without --barrier-dir ran unchecked, and refuses a mismatch of one rank",
          "[check]") {
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "2", "--", check_path(), "--colls", "barrier,all_gather", "--counts",
                        "1", "--dtypes", "i64", "-v"});
  const int status = job.wait(std::chrono::seconds(60));
  INFO(job.out() << job.err());
  CHECK(status == 0);
  CHECK(count_of(job.out(), "2 cases, 0 wrong (0 wrong elements); 3 barrier round(s) ran unchecked "
                            "(give --barrier-dir)") == 2);
  CHECK(count_of(job.out(), "ran barrier, not checked") == 6);
  CHECK_THAT(job.out(), !Catch::Contains("ok barrier"));

  LaunchedJob alone(dir, {"--nproc-per-node", "1", "--", check_path(), "--expect-mismatch", "count"});
  const int alone_status = alone.wait(std::chrono::seconds(60));
  INFO(alone.out() << alone.err());
  CHECK(alone_status == 2);
  CHECK_THAT(alone.err(), Catch::Contains("--expect-mismatch needs at least 2 ranks"));
  CHECK_THAT(alone.out(), !Catch::Contains("WRONG"));
}
