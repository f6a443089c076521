// Watches the ranks of one node until they have all ended: relays their
// output, reaps them, and stops the job when one fails, when the launcher is
// told to stop, or when the job runs past its timeout.
//
// One thread, one poll(2) over the signalfd, the ranks' pipes, (while
// output waits to be written) the launcher's stdout and stderr, and (while
// one rank reads it) the launcher's stdin and that rank's pipe, with a
// timeout computed from the nearest deadline (job timeout, SIGKILL after
// the grace period, output drain). Nothing spins, and nothing blocks: output
// goes through OutputSinks (output.h), and a rank's pipe is left unread
// while its sink is full, so a stalled reader of stdout holds up the ranks
// that write to it but never the timers and signals.
//
// Stopping sends SIGTERM (or the signal the launcher received) to every
// running rank's process group, then SIGKILL to those still running after
// the grace period. A second SIGINT/SIGTERM/SIGHUP/SIGQUIT while stopping sends
// SIGKILL at once. The first reason to stop decides the exit status; ranks
// that fail afterwards are the expected fallout and are not reported.
//
// Once every rank has ended, the launcher writes out the output still
// pending, waiting for a slow reader as `cat` would; the wait is still
// bounded by --timeout and ended by a signal. When the job is stopped for
// --timeout or a signal, output that stdout or stderr has not taken within
// the grace period (at least 2 s) is dropped, with a note on stderr
// if it takes one, so that the launcher exits on time.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <mutex>
#include <vector>

#include "tools/launcher/input.h"
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
  using Clock = launcher::Clock;

  // The job's timeout (zero: none) counts from `started`: construction, or
  // for a restarted job the first start (--timeout covers the restarts).
  // The watcher, if given, is told when a rank's group is gone (its leader
  // reaped); it was told of the group by spawn(). The input relay, if
  // given, is served while ranks run.
  Supervisor(SignalCatcher& signals, std::chrono::milliseconds timeout,
             std::chrono::milliseconds grace_period, Clock::time_point started = Clock::now(),
             GroupWatcher* watcher = nullptr, InputRelay* input = nullptr);
  // Kills (SIGKILL to its group) and reaps every rank still running: the
  // way out when run() was never called or threw.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Takes charge of a started rank.
  void add(RankProcess process);
  // Kills the ranks started so far at once, because the job cannot start
  // (told to on_first_failure as `why`); run() then reaps them and returns
  // exit_status.
  void abort(int exit_status, const std::string& why);
  // Returns once every rank has been reaped and its output written (or
  // dropped, see above): 0 when all exited 0, otherwise the status of the
  // first reason to stop.
  int run();
  // Whether the job stopped because a rank failed, not because braid-launch
  // was signalled, timed out or aborted the start: what --max-restarts
  // restarts.
  bool rank_failed() const { return rank_failed_ && !interrupted_; }
  // Whether a failure went to (or came from) the other nodes: a rank's,
  // this launcher's signal or --timeout, or another node's.
  bool told() const { return told_; }
  // Whether a second signal came while stopping (the ranks then killed):
  // whoever sent it wants the launcher gone, not serving the store longer.
  bool hurried() const { return hurried_; }
  // Called once, with the launcher's line about it, when the first rank
  // fails (before the others are stopped) or the launcher is told to stop.
  std::function<void(const std::string& line)> on_first_failure;
  // Called when a rank exits with status 0 while the job is not stopping,
  // with `line` saying so ("rank 2 (pid 123) exited with status 0") and
  // whether other ranks of this node still run: peers still setting up a
  // communicator would wait for it until BRAID_TIMEOUT.
  std::function<void(int rank, const std::string& line, bool others_running)> on_clean_exit;
  // Set by a launcher that made itself the subreaper of its ranks'
  // descendants (PR_SET_CHILD_SUBREAPER): what a rank started outside its
  // process group (setsid, setpgid, a daemon's double fork) and left
  // orphaned becomes the launcher's child, and is reaped as it exits and
  // killed once every rank has exited. `keep` lists the launcher's other
  // children (the guardian).
  bool adopts = false;
  std::vector<pid_t> keep;
  // From any thread: another node's rank failed (`why`, as that node told
  // it). The ranks still running here 5 s later (braid's learn of it
  // themselves, and say more) are stopped as for a signal (SIGTERM, SIGKILL
  // after the grace period) and run() returns 1, where the job is not
  // stopping already.
  void stop_for_other_node(const std::string& why);

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
  int next_poll_timeout_ms() const;
  void handle_signals();
  struct Exited {
    Rank* rank;
    bool killed;  // by a signal
    bool failed;  // killed, or a non-zero status
  };
  void reap_exited();
  // Reaps the adopted processes that have exited; with `end_all`, first
  // kills (SIGKILL, with their groups) those still running, until none is
  // left, and says how many there were.
  void reap_adopted(bool end_all);
  std::vector<Exited> exited_ranks();
  void forget_group(pid_t pid) noexcept;
  void on_rank_exit(const Rank& rank, const ExitStatus& status);
  void on_launcher_signal(int signo);
  void tell_once(const std::string& line);
  void close_unread(Stream& stream);
  void suspend();
  static int leftovers_after_a_moment(pid_t pid);
  void handle_deadlines();
  void on_timeout();
  void stop(int signo);
  void drop_output_after(Clock::duration wait);
  void signal_running(int signo);
  void kill_running_now() noexcept;
  int running_count() const;
  bool streams_open() const;
  bool reading_held_back() const;
  bool output_pending() const;
  bool done() const;
  static void read_stream(Stream& stream);
  static void flush_partial_line(Stream& stream, Clock::time_point now);
  void finish_streams();
  void drop_unwritten_output();

  void take_other_node_stop();
  void stop_for_other_node_now();

  SignalCatcher& signals_;
  UniqueFd other_node_event_;  // an eventfd stop_for_other_node writes
  std::mutex other_node_mu_;
  std::string other_node_why_;  // under other_node_mu_
  std::optional<Clock::time_point> other_node_deadline_;
  GroupWatcher* watcher_;
  InputRelay* input_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds grace_period_;
  std::vector<Rank> ranks_;
  std::vector<OutputSink*> sinks_;  // stdout's and stderr's, once each
  bool told_reader_gone_ = false;
  std::optional<Clock::time_point> job_deadline_;
  std::optional<Clock::time_point> kill_deadline_;
  std::optional<Clock::time_point> drain_deadline_;
  // Past it, output not yet written and pipes not yet read are dropped.
  std::optional<Clock::time_point> output_deadline_;
  bool stopping_ = false;
  bool rank_failed_ = false, interrupted_ = false;
  bool hurried_ = false;  // hurried()
  // The signal that stopped the job and when: the same one again within
  // kRepeatedSignal is that signal sent twice (timeout(1)), not a second.
  static constexpr std::chrono::milliseconds kRepeatedSignal{250};
  int first_signal_ = 0;
  Clock::time_point first_signal_at_{};
  bool told_ = false;  // on_first_failure was called
  int exit_status_ = 0;
};

}  // namespace braid::launcher
