// braid-launch's machinery: start N ranks on this node, serve the
// rendezvous store for them, relay their output and supervise them until
// they all end (the torchrun of braid).
//
// The launcher never calls exit(): launch() returns the status that
// braid-launch should exit with and throws for its own failures, after
// stopping whatever it had started.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace braid::launcher {

// Exit statuses of braid-launch besides the ranks' own.
inline constexpr int kExitUsage = 2;        // bad arguments; nothing started
inline constexpr int kExitTimeout = 124;    // --timeout expired (as timeout(1))
inline constexpr int kExitCannotExec = 127; // program missing or not executable

inline constexpr int kNoStdinRank = -1;  // --stdin none
// --node-rank not given to a node of a job across nodes: it takes its rank
// in the order the nodes reach node 0's store (torchrun's c10d rendezvous).
inline constexpr int kJoinOrderNodeRank = -1;

// The longest --timeout and --grace-period: about 31 years, in effect no
// limit, and far enough from the ends of std::chrono's clocks (some 292
// years of nanoseconds) that no deadline computed from it overflows.
inline constexpr std::chrono::seconds kMaxDuration{1'000'000'000};

struct LaunchOptions {
  int nproc_per_node = 1;                 // ranks on this node, >= 1
  int nnodes = 1;                         // nodes in the job, >= 1
  int node_rank = 0;                      // this node, in [0, nnodes), or kJoinOrderNodeRank
  std::string master_addr = "127.0.0.1";  // where ranks reach the store
  // Store port, 1..65535. 0 on a single node: pick a free one. Required
  // with nnodes > 1, since every node must know it in advance.
  int master_port = 0;
  // Empty: relay rank output prefixed with "[rank r] ". Otherwise each rank
  // writes <log_dir>/rank_<r>.out and .err (the directory is created).
  std::string log_dir;
  // Whole-job wall-clock limit; zero means none. At most kMaxDuration.
  std::chrono::milliseconds timeout{0};
  // How long ranks get between SIGTERM and SIGKILL when the job is stopped,
  // and output that stdout does not take is kept (at least 2 s). At most
  // kMaxDuration.
  std::chrono::milliseconds grace_period{5000};
  // The program and its arguments; the program is looked up in PATH.
  // On a rank's failure, stop every rank and start them all again, this many
  // times at most (torchrun's --max-restarts); one node only.
  int max_restarts = 0;
  // The rank whose stdin is the launcher's (input.h), among all nodes'
  // ranks; kNoStdinRank: none, every rank's stdin is /dev/null.
  int stdin_rank = 0;
  std::vector<std::string> command;
};

// Throws InvalidUsage with a message that names the bad option.
void validate(const LaunchOptions& options);

// Where the store listens and where ranks are told to reach it.
struct StoreEndpoints {
  std::string listen_addr;
  std::string advertised_addr;
};

// Resolves the store's addresses from --master-addr and BRAID_BIND_ADDR
// (bind_addr). The rule, for the cases where the two disagree: a loopback
// bind address with a non-loopback master address listens on the master
// address (the user named it, and other nodes could not reach loopback),
// and so does one with another loopback address (127.0.0.2, ::1: where the
// ranks are told to connect; not "localhost"); a
// specific non-loopback bind address with the default loopback master
// address is advertised as itself (ranks could not reach it on loopback).
StoreEndpoints store_endpoints(const LaunchOptions& options, const std::string& bind_addr);

// Validates, serves the store (single node, or node 0 of several), starts
// the ranks and supervises them to the end. Returns 0 when every rank
// exited 0; else the first failing rank's status (exit code, or 128 +
// signal), 128 + signal when the launcher itself was told to stop,
// kExitTimeout or kExitCannotExec. Throws InvalidUsage for bad options
// (nothing started) and SystemError when the launcher cannot proceed.
int launch(const LaunchOptions& options);

}  // namespace braid::launcher
