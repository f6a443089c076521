// Collective writes (trainer/train/write_together.h) on forked ranks with
// real communicators and real files: a slow disk delays a save without
// failing it, a stuck or failed one fails every rank alike and quickly.
// The ranks run with BRAID_TIMEOUT at 1 s; a save ended by a barrier timed
// out as soon as one rank wrote for longer than that.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "model_fixtures.h"
#include "runtime/errors.h"
#include "tests/comm/harness.h"
#include "trainer/checkpoint/atomic_file.h"
#include "trainer/train/write_together.h"

namespace braid::trainer {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr std::size_t kPiece = 4096;
constexpr int kPieces = 16;

// Sleeps for `d` in short naps, as a disk between chunks would, giving up
// when asked to.
void nap(WriteProgress& progress, std::chrono::milliseconds d) {
  for (auto end = std::chrono::steady_clock::now() + d; std::chrono::steady_clock::now() < end;) {
    if (progress.cancel.load()) throw SystemError("gave up");
    std::this_thread::sleep_for(10ms);
  }
}

// kPieces pieces of kPiece bytes, each counted by AtomicFile once the disk
// has it, with `between` after each.
void write_slowly(const fs::path& file, WriteProgress& progress, std::chrono::milliseconds between) {
  progress.chunk = kPiece;
  AtomicFile f(file, &progress);
  const std::string piece(kPiece, 'x');
  for (int i = 0; i < kPieces; ++i) {
    f.write(piece.data(), piece.size());
    nap(progress, between);
  }
  f.commit();
}

fs::path part(const fs::path& root, int rank) { return root / ("part" + std::to_string(rank)); }

// write_together on 3 forked ranks whose communicators time out after 1 s;
// rank r writes part(root, r) with write(r, file, progress), then runs
// `after`, if any.
using PartWriter = std::function<void(int rank, const fs::path& file, WriteProgress& progress)>;
braid::test::RunResult write_parts(const fs::path& root, const PartWriter& write,
                                   const std::function<void(comm::Communicator&)>& after = {}) {
  return braid::test::run_ranks(
      3,
      [&](comm::Communicator& comm) {
        write_together(comm, "the test's parts",
                       [&](WriteProgress& progress) { write(comm.rank(), part(root, comm.rank()), progress); });
        if (after) after(comm);
      },
      braid::test::run_options(60s, braid::test::test_config(1s)));
}

TEST_CASE("a collective write waits for a rank whose disk is slow but moving", "[checkpoint][write_together]") {
  test::TempDir dir;
  // Rank 1 takes 16 x 150 ms = 2.4 s, more than twice the timeout.
  const auto run = write_parts(
      dir.path(),
      [](int rank, const fs::path& file, WriteProgress& progress) {
        write_slowly(file, progress, rank == 1 ? 150ms : 0ms);
      },
      [&](comm::Communicator& comm) {  // it returns only once every rank's part is complete
        for (int r = 0; r < comm.size(); ++r) {
          const fs::path p = part(dir.path(), r);
          braid::test::expect(fs::exists(p) && fs::file_size(p) == kPiece * kPieces,
                              p.string() + " is not complete when write_together returns");
        }
      });
  INFO(run.summary());
  CHECK(run.all_ok());
  CHECK(run.elapsed >= 2400ms);
}

TEST_CASE("a collective write with a stuck rank fails every rank within about the timeout, naming it",
          "[checkpoint][write_together]") {
  test::TempDir dir;
  // Rank 2 writes two pieces (the first counts once the disk has it, the
  // second would at the next chunk or the commit), then nothing for 20 s.
  const auto run = write_parts(dir.path(), [](int rank, const fs::path& file, WriteProgress& progress) {
    if (rank != 2) return write_slowly(file, progress, 0ms);
    progress.chunk = kPiece;
    AtomicFile f(file, &progress);
    const std::string piece(kPiece, 'x');
    for (int i = 0; i < 2; ++i) f.write(piece.data(), piece.size());
    nap(progress, 20s);
    f.commit();
  });
  INFO(run.summary());
  REQUIRE(run.ranks.size() == 3);
  for (const auto& r : run.ranks) {
    CHECK_FALSE(r.ok());
    CHECK(r.message.find("the test's parts: no progress for 1000 ms") != std::string::npos);
    CHECK(r.message.find("rank 2 (4096 bytes on disk)") != std::string::npos);
  }
  CHECK(run.elapsed < 6s);
  // The stuck rank's temporary file is gone; it never became part2.
  CHECK_FALSE(fs::exists(part(dir.path(), 2)));
  for (const auto& e : fs::directory_iterator(dir.path())) CHECK(e.path().filename().string().rfind(".part2", 0) != 0);
}

// After rank 0 publishes a checkpoint step it removes the older ones: a
// removal that took longer than the timeout (many files, a slow disk)
// failed every rank with "no progress ... nothing was published", when
// `latest` already named the new step (a review helper's F2). Each file
// removed counts as progress, and a removal that does stall says the step
// was published.
TEST_CASE("a collective write waits for a slow removal after publishing, and a stuck one says it was published",
          "[checkpoint][write_together]") {
  test::TempDir dir;
  const auto slow = write_parts(dir.path(), [](int rank, const fs::path& file, WriteProgress& progress) {
    write_slowly(file, progress, 0ms);
    if (rank != 0) return;
    progress.published = true;
    for (int i = 0; i < 16; ++i) {  // 2.4 s, a file every 150 ms
      nap(progress, 150ms);
      ++progress.removed;
    }
  });
  INFO(slow.summary());
  CHECK(slow.all_ok());
  CHECK(slow.elapsed >= 2400ms);

  test::TempDir stuck_dir;
  const auto stuck = write_parts(stuck_dir.path(), [](int rank, const fs::path& file, WriteProgress& progress) {
    write_slowly(file, progress, 0ms);
    if (rank != 0) return;
    progress.published = true;
    progress.removed += 3;
    nap(progress, 20s);
  });
  INFO(stuck.summary());
  REQUIRE(stuck.ranks.size() == 3);
  for (const auto& r : stuck.ranks) {
    CHECK_FALSE(r.ok());
    CHECK(r.message.find("the test's parts: no progress for 1000 ms (BRAID_TIMEOUT) from rank 0 (published it, "
                         "then removed 3 files and directories of what it replaces)") != std::string::npos);
    CHECK(r.message.find("it was published") != std::string::npos);
    CHECK(r.message.find("nothing was published") == std::string::npos);
  }
  CHECK(stuck.elapsed < 6s);
}

TEST_CASE("a collective write that fails on one rank fails every rank, the failing one with its own error",
          "[checkpoint][write_together]") {
  test::TempDir dir;
  const auto run = write_parts(dir.path(), [](int rank, const fs::path&, WriteProgress&) {
    if (rank == 1) throw SystemError("no space left on the test's device");
  });
  INFO(run.summary());
  REQUIRE(run.ranks.size() == 3);
  CHECK(run.ranks[1].message.find("no space left on the test's device") != std::string::npos);
  for (int r : {0, 2}) {
    CHECK(run.ranks[r].message.find("the test's parts: rank 1 could not write its part") != std::string::npos);
  }
  CHECK(run.elapsed < 5s);
}

TEST_CASE("an atomic file with progress counts each chunk the disk has taken and gives up when asked", "[checkpoint]") {
  test::TempDir dir;
  WriteProgress progress;
  progress.chunk = 1000;
  const std::string bytes(10'500, 'y');
  {
    AtomicFile f(dir / "counted", &progress);
    f.write(bytes.data(), bytes.size());
    // Chunks count once the disk has them, one chunk behind the writes;
    // the commit's fsync counts the rest.
    CHECK(progress.bytes.load() == 9000);
    f.commit();
    CHECK(progress.bytes.load() == bytes.size());
  }
  CHECK(fs::file_size(dir / "counted") == bytes.size());
  progress.cancel = true;
  AtomicFile g(dir / "abandoned", &progress);
  CHECK_THROWS_WITH(g.write(bytes.data(), bytes.size()), Catch::Contains("was given up"));
}

}  // namespace
}  // namespace braid::trainer
