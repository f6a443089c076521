// Helpers shared by the failure tests (test_failures*.cc): run a body inside
// a rank so that its exception type, time to failure and text reach the
// parent, and parse that back out. See test_failures.cc for the approach.
#pragma once

#include <catch2/catch.hpp>
#include <signal.h>

#include <chrono>
#include <functional>
#include <string>

#include "runtime/errors.h"
#include "tests/comm/harness.h"

namespace braid::test::failures {

using std::chrono::milliseconds;
using std::chrono::seconds;

using SteadyClock = std::chrono::steady_clock;

inline long ms_since(SteadyClock::time_point start) {
  return static_cast<long>(
      std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start).count());
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline std::string kind_of(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const RemoteError*>(&e)) return "RemoteError";
  if (dynamic_cast<const InvalidUsage*>(&e)) return "InvalidUsage";
  if (dynamic_cast<const AbortedError*>(&e)) return "AbortedError";
  if (dynamic_cast<const SystemError*>(&e)) return "SystemError";
  if (dynamic_cast<const Error*>(&e)) return "Error";
  return "std::exception";
}

// Inside a rank: runs `body`; if it throws, the rank ends with the message
// "<Type after N ms> what()", N counted from the start of `body`.
inline void tagged(const std::function<void()>& body) {
  auto start = SteadyClock::now();
  try {
    body();
  } catch (const std::exception& e) {
    throw std::runtime_error("<" + kind_of(e) + " after " + std::to_string(ms_since(start)) + " ms> " +
                             e.what());
  }
}

// In the parent: a rank's result as tagged() wrote it.
struct Outcome {
  bool tagged = false;
  std::string type;  // "RemoteError", ...
  long ms = -1;      // time from the start of the tagged body to the throw
  std::string text;  // the exception's what()
};

inline Outcome outcome_of(const test::RankResult& r) {
  Outcome o;
  const std::string& m = r.message;
  auto after = m.find(" after ");
  auto close = m.find(" ms> ");
  if (m.rfind("<", 0) != 0 || after == std::string::npos || close == std::string::npos || after > close) {
    o.text = m;
    return o;
  }
  o.tagged = true;
  o.type = m.substr(1, after - 1);
  o.ms = std::stol(m.substr(after + 7, close - after - 7));
  o.text = m.substr(close + 5);
  return o;
}

// In the parent, after rank `killed` was SIGKILLed while the others waited
// on it: no harness timeout, and every other rank failed with a RemoteError
// that names the killed rank and `call` (the call it failed in, e.g.
// "broadcast #6"; "" to not check), within `within_ms` of its tagged start.
inline void check_killed_rank_named(const test::RunResult& result, int killed, const std::string& call,
                                    long within_ms) {
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.ranks[killed].signal == SIGKILL);
  for (int r = 0; r < static_cast<int>(result.ranks.size()); ++r) {
    if (r == killed) continue;
    const Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(result.ranks[r].exit_code == 1);
    CHECK(o.type == "RemoteError");
    CHECK(contains(o.text, call));
    CHECK(contains(o.text, "rank " + std::to_string(killed)));
    CHECK(o.ms < within_ms);
  }
}

// `transport`: BRAID_TRANSPORT, "tcp" or "shm" (all ranks share one host).
inline test::RunOptions options_with(milliseconds timeout, seconds deadline, const std::string& transport = "auto") {
  test::RunOptions options;
  options.deadline = deadline;
  options.config = test::test_config(timeout);
  options.config.transport = transport;
  return options;
}


}  // namespace braid::test::failures
