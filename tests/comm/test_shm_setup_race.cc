// A rank whose shared-memory set-up fails removes its segment and publishes
// why. It used to remove it first: a peer that opened the segment between
// the two found it gone (ENOENT) with no failure to name, and said only
// "opening a peer's shared memory ...: No such file or directory" (a
// review helper saw it in 2 of 6 runs of ranks given different
// BRAID_SHM_HOST_BYTES). The window is widened here: this binary
// interposes shm_unlink, and while slow_unlink is set each unlink is
// followed by 700 ms of sleep, as a descheduled rank would take. With the
// old order every run showed the bare error; now none may.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>

#include "tests/comm/failure_util.h"
#include "tests/comm/harness.h"

namespace {
std::atomic<bool> slow_unlink{false};
}  // namespace

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
