// runtime/topology: the CPU lists ranks exchange to decide whether they may
// spin (comm/setup.cc), read back and counted together.
#include <catch2/catch.hpp>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/topology.h"

using namespace braid::runtime;

TEST_CASE("distinct_cpus counts the CPUs that lists name together", "[topology]") {
  CHECK(distinct_cpus({"0", "1"}) == 2);     // two ranks bound one per core
  CHECK(distinct_cpus({"0", "0"}) == 1);     // two ranks bound to one core
  CHECK(distinct_cpus({"0-3", "2-5"}) == 6);  // overlapping sets
  CHECK(distinct_cpus({"0-1,4", "4"}) == 3);
  CHECK(distinct_cpus({"7"}) == 1);
  CHECK(distinct_cpus({"0", "no list"}) == 0);  // unreadable: the caller falls back
  CHECK(distinct_cpus({"0", ""}) == 0);
}

TEST_CASE("allowed_cpus lists this process's affinity", "[topology]") {
  const std::string mine = allowed_cpus();
  INFO(mine);
  CHECK(distinct_cpus({mine}) == available_cores());
}

// Two containers on one machine (same hostname and boot id, as with
// --network host and --uts host) with a /dev/shm each cannot share memory:
// their ranks took each other for local and failed opening the peer's
// segments. A mount namespace with its own /dev/shm stands in for one.
TEST_CASE("local_host_id tells apart processes with different /dev/shm", "[topology]") {
  const braid::runtime::Config config;
  const std::string here = braid::runtime::local_host_id(config);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    std::string id = "skip";
    if (::unshare(CLONE_NEWNS) == 0 && ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
        ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m") == 0)
      id = braid::runtime::local_host_id(config);
    [[maybe_unused]] ssize_t written = ::write(fds[1], id.data(), id.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string there;
  char buffer[512];
  for (ssize_t got; (got = ::read(fds[0], buffer, sizeof buffer)) > 0;) there.append(buffer, static_cast<std::size_t>(got));
  ::close(fds[0]);
  ::waitpid(child, nullptr, 0);
  if (there == "skip") {
    WARN("skipped: no mount namespace here (needs root)");
    return;
  }
  CHECK(there != here);
  braid::runtime::Config named;
  named.host_id = "node7";  // BRAID_HOST_ID is taken as it is
  CHECK(braid::runtime::local_host_id(named) == "node7");
}
