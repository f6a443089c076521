// runtime/topology: the CPU lists ranks exchange to decide whether they may
// spin (comm/setup.cc), read back and counted together.
#include <catch2/catch.hpp>

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
