// Two cases of a rank's shared-memory segment on a failed set-up.
//
// A rank whose shared-memory set-up fails removes its segment and publishes
// why. It used to remove it first: a peer that opened the segment between
// the two found it gone (ENOENT) with no failure to name, and said only
// "opening a peer's shared memory ...: No such file or directory" (a
// review helper saw it in 2 of 6 runs of ranks given different
// BRAID_SHM_HOST_BYTES). The window is widened here: this binary
// interposes shm_unlink, and while slow_unlink is set each unlink is
// followed by 700 ms of sleep, as a descheduled rank would take. With the
// old order every run showed the bare error; now none may.
//
// A rank that finds its segment's name taken (EEXIST: another job still
// running with the same token and run id) fails, and must leave that
// segment alone: the guard that removes a failed rank's segment removed it
// too, though this rank never made it (a review helper's reading). This
// binary also interposes shm_open: while plant_segment is set, creating a
// segment whose name ends in "-1" (rank 1's) makes it first, as that other
// job would have, and then fails with EEXIST.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>
#include <string_view>

#include "tests/comm/failure_util.h"
#include "tests/comm/harness.h"

namespace {
std::atomic<bool> slow_unlink{false};
std::atomic<bool> plant_segment{false};
}  // namespace

extern "C" int shm_open(const char* name, int flags, mode_t mode) {
  using Real = int (*)(const char*, int, mode_t);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "shm_open"));
  const std::string_view n(name);
  if (plant_segment.load() && (flags & O_EXCL) && n.size() > 2 && n.substr(n.size() - 2) == "-1") {
    const int fd = real(name, O_CREAT | O_EXCL | O_RDWR, 0600);  // the other job's
    if (fd >= 0) close(fd);
    errno = EEXIST;
    return -1;
  }
  return real(name, flags, mode);
}

// Every shm_unlink of this process (libbraid_comm's too: the executable's
// definition comes first), the real one through RTLD_NEXT.
extern "C" int shm_unlink(const char* name) {
  using Real = int (*)(const char*);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "shm_unlink"));
  const int result = real(name);
  if (slow_unlink.load()) usleep(700'000);
  return result;
}

using namespace braid;
using namespace braid::comm;
using namespace braid::test::failures;

TEST_CASE("a rank whose shm set-up fails names its reason to peers that find its segment gone", "[abuse][shm]") {
  auto options = options_with(std::chrono::seconds(20), std::chrono::seconds(90), "shm");
  // Each rank sizes the others' segments by its own budget: rank 0 finds
  // rank 1's segment larger than it expects, and fails.
  options.configure = [](int rank, runtime::Config& config) {
    config.shm_host_bytes = std::size_t{1} << (20 + 10 * rank);  // 1M, 1G, 1T
  };
  for (int run = 0; run < 3; ++run) {
    slow_unlink = true;  // inherited by the ranks' processes
    auto result = test::run_ranks(3, [](Communicator&) {}, options);
    slow_unlink = false;
    INFO("run " << run << "\n" << result.summary());
    REQUIRE_FALSE(result.timed_out);
    for (const auto& rank : result.ranks) {
      CHECK_FALSE(rank.ok());
      CHECK_FALSE(contains(rank.message, "No such file or directory"));
      CHECK(contains(rank.message, "BRAID_SHM_"));
    }
    CHECK(result.leftover_shm == 0);
  }
}

TEST_CASE("a rank that finds its segment's name taken leaves that segment alone", "[abuse][shm]") {
  auto options = options_with(std::chrono::seconds(20), std::chrono::seconds(60), "shm");
  plant_segment = true;  // inherited by the ranks' processes
  auto result = test::run_ranks(2, [](Communicator&) {}, options);
  plant_segment = false;
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK_FALSE(result.ranks[1].ok());
  CHECK(contains(result.ranks[1].message, "File exists"));
  CHECK_FALSE(result.ranks[0].ok());
  // The planted segment is the one left (the harness counts and removes
  // the job's segments after the run); rank 0's own went with its failure.
  CHECK(result.leftover_shm == 1);
}
