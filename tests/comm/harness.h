// Multi-process test harness: runs a function on N real processes (fork),
// each with a world Communicator over real loopback sockets, under a deadline.
//
// The parent serves the store (as braid-launch would), forks the ranks and
// waits; a rank that throws writes the message to its result file and exits
// 1. When the deadline passes every rank is killed with SIGKILL and the run
// reports it. Temporary files are removed whatever happens. Inside ranks use
// braid::test::expect(), not Catch2 macros: Catch2 runs in the parent only.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "runtime/config.h"

namespace braid::test {

struct RankResult {
  int exit_code = -1;     // -1 if killed by a signal
  int signal = 0;         // the signal that ended it, 0 if it exited
  std::string message;    // what the rank wrote to its result file (error text)
  bool ok() const { return exit_code == 0; }
};

struct RunResult {
  std::vector<RankResult> ranks;
  bool timed_out = false;
  int leftover_shm = 0;  // segments of the job found in /dev/shm after the ranks ended (then removed)
  std::chrono::milliseconds elapsed{0};
  bool all_ok() const;
  std::string summary() const;  // one line per rank, for failure messages
};

struct RunOptions {
  std::chrono::seconds deadline{120};
  runtime::Config config;  // settings every rank's communicator gets
  // When set, rank r runs with config.host_id = host_of(r): a forced
  // topology, e.g. two "hosts" of two ranks on one machine.
  std::function<std::string(int rank)> host_of;
  // When set, adjusts rank r's copy of `config` (settings that differ by rank).
  std::function<void(int rank, runtime::Config& config)> configure;
  // When set, runs in rank r's child before anything else (e.g. setns into
  // the rank's network namespace) and returns the address its communicator
  // listens on.
  std::function<std::string(int rank)> enter_rank;
  // The store's address; `store_netns` (an open /var/run/netns fd, or -1)
  // is the namespace it listens in.
  std::string store_host = "127.0.0.1";
  int store_netns = -1;
  // Rank 0's communicator serves the store (as without a launcher), not
  // the test's process.
  bool store_by_rank0 = false;
  // When set, runs on each rank instead of fn, owning the world
  // communicator (to destroy it before others it made), with what made it.
  std::function<void(std::unique_ptr<comm::Communicator>, const runtime::RankInfo&, const runtime::Config&)> own_world;
};

// Options with a deadline and every rank's config, the rest as defaults.
inline RunOptions run_options(std::chrono::seconds deadline, runtime::Config config) {
  RunOptions options;
  options.deadline = deadline;
  options.config = std::move(config);
  return options;
}

// fn(comm, rank) runs on each of `size` ranks. Its return value is ignored;
// a throw marks the rank failed with e.what() as its message.
RunResult run_ranks(int size, const std::function<void(comm::Communicator&)>& fn, RunOptions options = {});

// Throws std::runtime_error(message) when `condition` is false.
inline void expect(bool condition, const std::string& message) {
  if (!condition) throw std::runtime_error(message);
}

// A default config for tests: short timeout, small segments and all-reduce
// chunks so that small counts still exercise pipelining and rounds.
runtime::Config test_config(std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace braid::test
