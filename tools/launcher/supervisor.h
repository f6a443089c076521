// Watches the ranks of one node until they have all ended: relays their
// output, reaps them, and stops the job when one fails, when the launcher is
// told to stop, or when the job runs past its timeout.
//
// One thread, one poll(2) over the signalfd and the ranks' pipes, with a
// timeout computed from the nearest deadline (job timeout, SIGKILL after
// the grace period, output drain). Nothing spins.
//
// Stopping sends SIGTERM (or the signal the launcher received) to every
// running rank's process group, then SIGKILL to those still running after
// the grace period. A second SIGINT/SIGTERM/SIGHUP while stopping sends
// SIGKILL at once. The first reason to stop decides the exit status; ranks
// that fail afterwards are the expected fallout and are not reported.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <vector>

#include "tools/launcher/output.h"
#include "tools/launcher/process.h"
#include "tools/launcher/signals.h"

namespace braid::launcher {

// A started rank handed to the supervisor. Its pipes are invalid when its
// output goes to files (--log-dir).
struct RankProcess {
  int rank = 0;
  pid_t pid = -1;
  UniqueFd stdout_pipe;
  UniqueFd stderr_pipe;
};

class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;

  // The job's timeout (zero: none) counts from `started`: construction, or
  // for a restarted job the first start (--timeout covers the restarts).
  Supervisor(SignalCatcher& signals, std::chrono::milliseconds timeout,
             std::chrono::milliseconds grace_period, Clock::time_point started = Clock::now());

  // Takes charge of a started rank.
  void add(RankProcess process);
  // Kills the ranks started so far at once, because the job cannot start;
  // run() then reaps them and returns exit_status.
  void abort(int exit_status);
  // Returns once every rank has been reaped and its output drained: 0 when
  // all exited 0, otherwise the status of the first reason to stop.
  int run();
  // Whether the job stopped because a rank failed, not because braid-launch
  // was signalled, timed out or aborted the start: what --max-restarts
  // restarts.
  bool rank_failed() const { return rank_failed_ && !interrupted_; }

 private:
  struct Stream {
    UniqueFd fd;
    LineRelay relay;
  };
  struct Rank {
    int rank;
    pid_t pid;
    bool running;
    Stream out;
    Stream err;
  };

  void wait_for_events();
  int poll_timeout_ms() const;
  void handle_signals();
  void reap_exited();
  void on_rank_exit(const Rank& rank, const ExitStatus& status);
  void on_launcher_signal(int signo);
  void handle_deadlines();
  void stop(int signo);
  void signal_running(int signo);
  int running_count() const;
  bool done() const;
  static void read_stream(Stream& stream);
  void finish_streams();

  SignalCatcher& signals_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds grace_period_;
  std::vector<Rank> ranks_;
  std::optional<Clock::time_point> job_deadline_;
  std::optional<Clock::time_point> kill_deadline_;
  std::optional<Clock::time_point> drain_deadline_;
  bool stopping_ = false;
  bool rank_failed_ = false, interrupted_ = false;
  int exit_status_ = 0;
};

}  // namespace braid::launcher
