// Helpers of the tensor- and pipeline-parallel tests (picotron's way: build
// the parallel model and the whole one from the same weights, compare
// losses and gradients). Inside forked ranks failures are thrown with
// braid::test::expect, since Catch2 runs only in the parent.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/comm/harness.h"
#include "tests/trainer/model_fixtures.h"
#include "trainer/model/gpt.h"
#include "trainer/model/rng.h"

namespace braid::trainer::test {

// Copies this rank's part (TP slice, PP stage) of every tensor out of a
// whole (tp_size 1, one stage) model.
inline void copy_from_whole(const Gpt& whole, Gpt& part) {
  for (const ParamView& v : part.table().views()) {
    const float* full = whole.params().data() + whole.table().find(v.name).offset;
    copy_tp_part(v, part.layout(), full, part.params().data() + v.offset);
  }
}

inline std::vector<std::int32_t> random_ints(std::size_t count, std::uint64_t seed, int bound = 256) {
  Rng rng(seed);
  std::vector<std::int32_t> t(count);
  for (auto& x : t) x = static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(bound));
  return t;
}

inline std::vector<float> random_floats(std::size_t count, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(count);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  return x;
}

// Throws, naming `what` and the worst element, unless every |got - want| <=
// tolerance * (1 + max |want|): float sums in another order, nothing more.
inline void expect_close(const std::string& what, const float* got, const float* want, std::size_t count,
                         double tolerance = 1e-4) {
  double scale = 0.0, worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < count; ++i) scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  for (std::size_t i = 0; i < count; ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (d > worst) worst = d, at = i;
  }
  braid::test::expect(worst <= tolerance * (1.0 + scale),
                      what + ": element " + std::to_string(at) + " is " + std::to_string(got[at]) + ", expected " +
                          std::to_string(want[at]) + " (largest value " + std::to_string(scale) + ")");
}

inline void expect_close(const std::string& what, double got, double want, double tolerance = 1e-5) {
  braid::test::expect(std::fabs(got - want) <= tolerance * (1.0 + std::fabs(want)),
                      what + " is " + std::to_string(got) + ", expected " + std::to_string(want));
}

// Settings for forked ranks whose point-to-point sends really wait for the
// receiver: shared memory with the smallest ring (4 KiB), so any message
// larger than that is handed over only while the peer receives it, and a
// schedule that lets two neighbours send at once deadlocks (and fails at
// the timeout) instead of passing by luck.
inline braid::test::RunOptions rendezvous_run_options() {
  braid::test::RunOptions options;
  options.deadline = std::chrono::seconds(60);
  options.config = braid::test::test_config(std::chrono::seconds(20));
  options.config.transport = "shm";
  options.config.shm_ring_bytes = 4096;
  return options;
}

}  // namespace braid::trainer::test
