#include "tools/launcher/supervisor.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
#include <thread>

#include "tools/launcher/launcher.h"

namespace braid::launcher {
namespace {

// Once every rank is reaped its group has been killed, so its pipes reach
// end-of-file at once; this bounds the wait for a descendant that left the
// group (setsid) and still holds one.
// It is also the least time output gets to drain when the job is stopped
// for --timeout or a signal, however short the grace period.
constexpr std::chrono::milliseconds kDrainTime{2000};
// How long the destructor waits for SIGKILLed ranks to be reaped: a process
// stuck in the kernel (uninterruptible sleep) dies only when it leaves it.
constexpr std::chrono::milliseconds kReapTime{2000};
// How long a rank's failure by exit status waits for another rank to turn
// out killed by a signal, the likelier cause (reap_exited).
constexpr std::chrono::milliseconds kKilledPeerWait{100};
// How long ranks get to end by themselves once another node has failed
// (take_other_node_stop).
constexpr std::chrono::milliseconds kOtherNodeWait{5000};

std::string count_of_ranks(int count) {
  return std::to_string(count) + (count == 1 ? " rank" : " ranks");
}

std::string seconds_text(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(duration.count()) / 1000.0);
  return text;
}

}  // namespace

Supervisor::Supervisor(SignalCatcher& signals, std::chrono::milliseconds timeout,
                       std::chrono::milliseconds grace_period, Clock::time_point started,
                       GroupWatcher* watcher, InputRelay* input)
    : signals_(signals), watcher_(watcher), input_(input), timeout_(timeout), grace_period_(grace_period) {
  if (timeout.count() > 0) job_deadline_ = deadline_after(started, timeout);
  other_node_event_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!other_node_event_.valid()) throw SystemError(errno_message("eventfd", errno));
  sinks_.push_back(&standard_sink(1));
  if (&standard_sink(2) != sinks_.front()) sinks_.push_back(&standard_sink(2));
}

Supervisor::~Supervisor() { kill_running_now(); }

void Supervisor::add(RankProcess process) {
  std::string prefix = rank_line_prefix(process.rank);
  ranks_.push_back(Rank{process.rank, process.pid, true,
                        Stream{std::move(process.stdout_pipe), LineRelay(prefix, standard_sink(1))},
                        Stream{std::move(process.stderr_pipe), LineRelay(prefix, standard_sink(2))}});
}

void Supervisor::abort(int exit_status, const std::string& why) {
  tell_once(why);
  exit_status_ = exit_status;
  stopping_ = true;
  signal_running(SIGKILL);
  drop_output_after(kDrainTime);
}

int Supervisor::run() {
  while (!done()) {
    wait_for_events();
    handle_deadlines();
  }
  finish_streams();
  drop_unwritten_output();
  return exit_status_;
}

void Supervisor::wait_for_events() {
  std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
  std::vector<OutputSink*> sinks;
  for (OutputSink* sink : sinks_) {
    if (!sink->has_pending()) continue;
    fds.push_back({sink->poll_fd(), POLLOUT, 0});
    sinks.push_back(sink);
  }
  // A pipe whose sink is full stays unread (backpressure): its rank blocks
  // on its own writes until the reader of our stdout catches up.
  std::vector<Stream*> streams;
  for (Rank& rank : ranks_) {
    for (Stream* stream : {&rank.out, &rank.err}) {
      if (stream->fd.valid() && stream->relay.sink().reader_gone()) close_unread(*stream);
      if (!stream->fd.valid() || stream->relay.sink().full()) continue;
      fds.push_back({stream->fd.get(), POLLIN, 0});
      streams.push_back(stream);
    }
  }
  const std::size_t other_node_at = fds.size();
  fds.push_back({other_node_event_.get(), POLLIN, 0});
  // The input's two ends go last, -1 (ignored by poll) when not wanted.
  const bool serving_input = input_ != nullptr && running_count() > 0;
  fds.push_back({serving_input ? input_->source_poll_fd() : -1, POLLIN, 0});
  fds.push_back({serving_input ? input_->target_poll_fd() : -1, POLLOUT, 0});
  if (::poll(fds.data(), fds.size(), next_poll_timeout_ms()) < 0) {
    if (errno == EINTR) return;
    throw SystemError(errno_message("poll", errno));
  }
  for (std::size_t i = 0; i < sinks.size(); ++i)
    if (fds[1 + i].revents != 0) sinks[i]->flush();
  // Output first: a rank's last lines are already in its pipe when its
  // SIGCHLD arrives, and reaping does not lose them either way.
  for (std::size_t i = 0; i < streams.size(); ++i)
    if (fds[1 + sinks.size() + i].revents != 0) read_stream(*streams[i]);
  if (serving_input) {
    if (fds[fds.size() - 2].revents != 0 && input_->read_source())
      for (OutputSink* sink : sinks_) sink->terminal_line_ended();
    if (fds[fds.size() - 1].revents != 0) input_->write_target();
  }
  if (fds[other_node_at].revents != 0) take_other_node_stop();
  if (fds[0].revents != 0) handle_signals();
}

void Supervisor::stop_for_other_node(const std::string& why) {
  {
    std::lock_guard lock(other_node_mu_);
    if (!other_node_why_.empty()) return;
    other_node_why_ = why;
  }
  const std::uint64_t one = 1;
  (void)!::write(other_node_event_.get(), &one, sizeof one);
}

// Braid's ranks learn of a peer's death through their transports, and say
// more than this launcher can (which call, which device): they get
// kOtherNodeWait to end by themselves (RDMA's keepalive names a dead peer
// within about 2 s) before the ranks still running are stopped.
void Supervisor::take_other_node_stop() {
  std::uint64_t count = 0;
  (void)!::read(other_node_event_.get(), &count, sizeof count);
  if (!other_node_deadline_) other_node_deadline_ = deadline_after(Clock::now(), kOtherNodeWait);
}

void Supervisor::stop_for_other_node_now() {
  std::string why;
  {
    std::lock_guard lock(other_node_mu_);
    why = other_node_why_;
  }
  const int running = running_count();
  if (why.empty() || stopping_ || running == 0) return;
  say("the job failed on another node (" + why + "); stopping this node's " + count_of_ranks(running) + ", " +
      seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(kOtherNodeWait)) +
      " after it was told");
  told_ = true;  // that node told the others
  rank_failed_ = true;
  exit_status_ = 1;
  stop(SIGTERM);
  drop_output_after(std::max<Clock::duration>(grace_period_, kDrainTime));
}

int Supervisor::next_poll_timeout_ms() const {
  std::optional<Clock::time_point> nearest;
  auto consider = [&](const std::optional<Clock::time_point>& deadline) {
    if (deadline && (!nearest || *deadline < *nearest)) nearest = deadline;
  };
  consider(job_deadline_);
  consider(kill_deadline_);
  if (running_count() > 0) consider(other_node_deadline_);
  for (const Rank& rank : ranks_)
    for (const Stream* stream : {&rank.out, &rank.err}) consider(stream->relay.partial_deadline());
  if (input_ != nullptr && running_count() > 0) consider(input_->recheck_deadline(Clock::now()));
  // These two matter only once every rank has ended (done(),
  // handle_deadlines()); before, one that has passed would make poll spin.
  if (running_count() == 0) {
    consider(output_deadline_);
    if (streams_open()) consider(drain_deadline_);
  }
  return poll_timeout_ms(nearest, Clock::now());
}

void Supervisor::handle_signals() {
  for (int signo : signals_.take()) {
    if (signo == SIGCHLD)
      reap_exited();
    else if (signo == SIGTSTP)
      suspend();
    else if (signo == SIGCONT)
      signal_running(SIGCONT);
    else
      on_launcher_signal(signo);
  }
}

// Ranks that have exited and are not yet reaped, as waitid tells (WNOWAIT).
std::vector<Supervisor::Exited> Supervisor::exited_ranks() {
  std::vector<Exited> exited;
  for (Rank& rank : ranks_) {
    if (!rank.running) continue;
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(rank.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0)
      continue;
    const bool killed = info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED;
    exited.push_back({&rank, killed, killed || info.si_status != 0});
  }
  return exited;
}

// The job's first failure is the first rank reaped. A rank killed by a
// signal (SIGKILL, the OOM killer) closes its sockets before its parent can
// see it exit, and a peer that noticed the close at once and exited 1 was
// at times reaped first: named as the failure, the job's status 1 instead
// of 137. So a first failure by exit status waits up to kKilledPeerWait for
// another rank to turn out killed, which then goes first; ranks that merely
// exit meanwhile (the peers of a rank that failed, on their lost
// connections) go after those seen before the wait.
void Supervisor::reap_exited() {
  std::vector<Exited> exited = exited_ranks();
  auto any = [](const std::vector<Exited>& list, bool Exited::*what) {
    return std::any_of(list.begin(), list.end(), [what](const Exited& e) { return e.*what; });
  };
  if (!stopping_ && any(exited, &Exited::failed) && !any(exited, &Exited::killed)) {
    const auto give_up = Clock::now() + kKilledPeerWait;
    std::vector<Exited> later = exited;
    while (!any(later, &Exited::killed) && Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      later = exited_ranks();
    }
    for (const Exited& e : later)
      if (e.killed) exited.insert(exited.begin(), e);
  }
  std::stable_partition(exited.begin(), exited.end(), [](const Exited& e) { return e.killed; });
  for (const Exited& each : exited) {
    Rank& rank = *each.rank;
    // While the rank is an unreaped zombie its pid, and so its group id,
    // cannot be reused: kill what it left behind in its group, then reap.
    // A rank that succeeded may not know that what it left running (a
    // background upload) ends with it: it was killed without a word.
    if (!each.failed && !stopping_)
      if (const int left = leftovers_after_a_moment(rank.pid); left > 0)
        say("rank " + std::to_string(rank.rank) + " exited leaving " + std::to_string(left) +
            " process(es) it started still running in its process group (a background job?); they are killed "
            "now, as everything a rank starts ends with it: wait for them before the rank exits");
    signal_group(rank.pid, SIGKILL);
    int status = 0;
    while (waitpid(rank.pid, &status, 0) < 0 && errno == EINTR) {
    }
    forget_group(rank.pid);
    rank.running = false;
    on_rank_exit(rank, decode_wait_status(status));
  }
  if (adopts) reap_adopted(running_count() == 0);
}

void Supervisor::reap_adopted(bool end_all) {
  auto adopted = [this](pid_t pid) {
    if (std::find(keep.begin(), keep.end(), pid) != keep.end()) return false;
    return std::none_of(ranks_.begin(), ranks_.end(), [pid](const Rank& r) { return r.running && r.pid == pid; });
  };
  int killed = 0;
  // Rounds: one killed may leave children of its own, adopted in turn.
  for (int round = 0; round < 16; ++round) {
    bool any = false;
    for (const ChildProcess& child : children_of(getpid())) {
      if (!adopted(child.pid) || (!end_all && child.state != 'Z')) continue;
      any = true;
      if (child.state != 'Z') {
        // A member of a rank's own group was sent SIGKILL with it
        // (reap_exited) and comes here when the rank's death orphans it,
        // often before it has died itself: it did not leave its group.
        const pid_t group = getpgid(child.pid);
        if (std::none_of(ranks_.begin(), ranks_.end(), [group](const Rank& r) { return r.pid == group; })) ++killed;
        if (group == child.pid) ::kill(-child.pid, SIGKILL);
        ::kill(child.pid, SIGKILL);
      }
      // Bounded: a process stuck in the kernel dies only when it leaves it.
      const auto give_up = Clock::now() + (child.state == 'Z' ? std::chrono::milliseconds(0) : kReapTime);
      while (waitpid(child.pid, nullptr, WNOHANG) == 0 && Clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (!any || !end_all) break;
  }
  if (killed > 0)
    say(std::to_string(killed) + " process(es) the ranks started outside their process groups (setsid, setpgid, a "
        "daemon) were still running once every rank had exited; they are killed now, as everything a rank "
        "starts ends with it");
}

// What a rank that exited left in its group, looked at for up to 100 ms:
// helpers that end by themselves once their parent has (Python's
// multiprocessing resource tracker, a forkserver) are often still there at
// the first look.
int Supervisor::leftovers_after_a_moment(pid_t pid) {
  int left = others_in_group(pid);
  for (int look = 0; left > 0 && look < 10; ++look) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    left = others_in_group(pid);
  }
  return left;
}

// Once its leader is reaped, a group's id may be reused (once the group
// has emptied): the guardian must not keep it.
void Supervisor::forget_group(pid_t pid) noexcept {
  if (watcher_) watcher_->forget(pid);
}

void Supervisor::on_rank_exit(const Rank& rank, const ExitStatus& status) {
  if (stopping_) return;
  if (status.success()) {
    if (on_clean_exit)
      on_clean_exit(rank.rank, "rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) + ") " +
                                   describe(status),
                    running_count() > 0);
    return;
  }
  int others = running_count();
  const std::string line = "rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) +
                           ") " + describe(status);
  // The other nodes are told what failed, not what this node does about
  // it ("...; stopping the other rank on node 1" read as node 1's rank).
  say(line + (others == 1  ? "; stopping the other rank"
              : others > 1 ? "; stopping the other " + count_of_ranks(others)
                           : ""));
  tell_once(line);
  exit_status_ = status.shell_status();
  rank_failed_ = true;
  stop(SIGTERM);
}

void Supervisor::on_launcher_signal(int signo) {
  interrupted_ = true;
  int running = running_count();
  if (running == 0) {
    // Every rank has ended and the launcher is waiting for a slow reader:
    // the signal ends the wait, and the output is cut short.
    if (output_pending()) {
      if (!stopping_) exit_status_ = 128 + signo;
      stopping_ = true;
      drop_output_after(Clock::duration::zero());
    }
    return;
  }
  // timeout(1) sends its signal to the launcher, then to its own process
  // group, the launcher again: that same signal an instant later is the
  // first one still, not a second Ctrl-C, and the ranks keep their grace
  // period to save (they were SIGKILLed at once, 2 runs in 3; a review
  // helper's case).
  if (stopping_ && signo == first_signal_ && Clock::now() - first_signal_at_ < kRepeatedSignal) return;
  if (stopping_) {
    say("received " + signal_name(signo) + " while stopping; killing the remaining " +
        count_of_ranks(running) + " now");
    hurried_ = true;
    signal_running(SIGKILL);
    drop_output_after(Clock::duration::zero());
    return;
  }
  first_signal_ = signo;
  first_signal_at_ = Clock::now();
  say("received " + signal_name(signo) + "; forwarding it to " + count_of_ranks(running));
  // The other nodes' ranks would wait for this node's until BRAID_TIMEOUT.
  tell_once("its launcher was stopped by " + signal_name(signo) + ", with its ranks");
  exit_status_ = 128 + signo;
  stop(signo);
  drop_output_after(std::max<Clock::duration>(grace_period_, kDrainTime));
}

// Ctrl-Z (SIGTSTP) reaches the terminal's foreground group, the
// launcher's; each rank runs in a group of its own, so only the launcher
// stopped and the ranks ran on. They are sent SIGTSTP (a rank may handle
// it, as under a shell), then the launcher stops itself; SIGCONT (fg, bg)
// continues it, and it passes that on (handle_signals).
void Supervisor::suspend() {
  signal_running(SIGTSTP);
  ::raise(SIGSTOP);
}

void Supervisor::tell_once(const std::string& line) {
  if (!on_first_failure || told_) return;
  told_ = true;
  on_first_failure(line);
}

void Supervisor::handle_deadlines() {
  auto now = Clock::now();
  for (Rank& rank : ranks_)
    for (Stream* stream : {&rank.out, &rank.err})
      if (auto due = stream->relay.partial_deadline(); due && now >= *due) flush_partial_line(*stream, now);
  if (job_deadline_ && now >= *job_deadline_) {
    job_deadline_.reset();
    on_timeout();
  }
  if (other_node_deadline_ && now >= *other_node_deadline_) {
    other_node_deadline_.reset();
    stop_for_other_node_now();
  }
  if (kill_deadline_ && now >= *kill_deadline_) {
    kill_deadline_.reset();
    if (int running = running_count(); running > 0) {
      say(count_of_ranks(running) + " still running " + seconds_text(grace_period_) +
          " after being told to stop; sending SIGKILL");
      signal_running(SIGKILL);
    }
  }
  if (running_count() > 0) return;
  // The drain time bounds pipes that a descendant outside the group keeps
  // open; time spent not reading them for lack of room does not count.
  if (!drain_deadline_ || reading_held_back()) drain_deadline_ = now + kDrainTime;
  if (now >= *drain_deadline_) finish_streams();
}

// --timeout bounds the whole job: the ranks, and also the wait for a slow
// reader after they have ended or were stopped for another reason (which
// then still decides the exit status).
void Supervisor::on_timeout() {
  if (!stopping_) {
    int running = running_count();
    say("the job ran past its --timeout of " + seconds_text(timeout_) +
        (running > 0 ? "; stopping " + count_of_ranks(running)
                     : "; its ranks have ended but their output is not all written yet"));
    exit_status_ = kExitTimeout;
    interrupted_ = true;
    tell_once("its launcher's --timeout of " + seconds_text(timeout_) + " ran out");
    stop(SIGTERM);
  }
  drop_output_after(std::max<Clock::duration>(grace_period_, kDrainTime));
}

void Supervisor::stop(int signo) {
  stopping_ = true;
  signal_running(signo);
  // A stopped rank (SIGSTOP, a debugger's, one its peers timed out on)
  // holds a signal pending until it runs again: without SIGCONT the job
  // waited out the grace period for it.
  signal_running(SIGCONT);
  kill_deadline_ = deadline_after(Clock::now(), grace_period_);
}

void Supervisor::drop_output_after(Clock::duration wait) {
  Clock::time_point deadline = deadline_after(Clock::now(), wait);
  if (!output_deadline_ || deadline < *output_deadline_) output_deadline_ = deadline;
}

void Supervisor::signal_running(int signo) {
  for (const Rank& rank : ranks_)
    if (rank.running) signal_group(rank.pid, signo);
}

// The way out of an exception: no messages, no throwing, and a bounded wait.
// A rank still unreaped at the end is left to PR_SET_PDEATHSIG's SIGKILL,
// to init, and (its group still watched) to the guardian.
void Supervisor::kill_running_now() noexcept {
  for (const Rank& rank : ranks_)
    if (rank.running) ::kill(-rank.pid, SIGKILL);
  const auto give_up = Clock::now() + kReapTime;
  for (Rank& rank : ranks_) {
    while (rank.running) {
      pid_t reaped = waitpid(rank.pid, nullptr, WNOHANG);
      if (reaped == rank.pid || (reaped < 0 && errno != EINTR)) {
        rank.running = false;
        forget_group(rank.pid);
      }
      if (!rank.running || Clock::now() >= give_up) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

int Supervisor::running_count() const {
  int count = 0;
  for (const Rank& rank : ranks_) count += rank.running ? 1 : 0;
  return count;
}

bool Supervisor::streams_open() const {
  for (const Rank& rank : ranks_)
    if (rank.out.fd.valid() || rank.err.fd.valid()) return true;
  return false;
}

bool Supervisor::reading_held_back() const {
  for (const Rank& rank : ranks_)
    for (const Stream* stream : {&rank.out, &rank.err})
      if (stream->fd.valid() && stream->relay.sink().full()) return true;
  return false;
}

bool Supervisor::output_pending() const {
  return std::any_of(sinks_.begin(), sinks_.end(), [](const OutputSink* sink) { return sink->has_pending(); });
}

bool Supervisor::done() const {
  if (running_count() > 0) return false;
  if (output_deadline_ && Clock::now() >= *output_deadline_) return true;
  return !streams_open() && !output_pending();
}

// Nothing reads where this stream goes (`braid-launch ... | head` after
// head exited): closing its pipe makes the rank's next write there fail as
// it would without the launcher between (output.h).
void Supervisor::close_unread(Stream& stream) {
  if (!told_reader_gone_) {
    told_reader_gone_ = true;
    say("the reader of its output has gone (a write there failed with EPIPE); the ranks' pipes to it are closed, "
        "so their next write there fails");
  }
  stream.relay.finish();
  stream.fd.reset();
}

void Supervisor::read_stream(Stream& stream) {
  char buffer[64 << 10];
  ssize_t n = ::read(stream.fd.get(), buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    stream.relay.finish();
    stream.fd.reset();
    return;
  }
  stream.relay.feed(std::string_view(buffer, static_cast<std::size_t>(n)));
}

// An unfinished line is written out only when its rank has written no
// more: not while the rest may wait unread in the pipe, held back by a full
// sink or not yet read, which would cut a line of a fast writer in two.
void Supervisor::flush_partial_line(Stream& stream, Clock::time_point now) {
  int unread = 0;
  if (stream.relay.sink().full() ||
      (stream.fd.valid() && ::ioctl(stream.fd.get(), FIONREAD, &unread) == 0 && unread > 0))
    stream.relay.wait_longer(now);
  else
    stream.relay.flush_partial();
}

void Supervisor::finish_streams() {
  for (Rank& rank : ranks_) {
    for (Stream* stream : {&rank.out, &rank.err}) {
      stream->relay.finish();
      stream->fd.reset();
    }
  }
}

// Reached with output pending only past the output deadline (done()).
void Supervisor::drop_unwritten_output() {
  std::size_t dropped = 0;
  for (OutputSink* sink : sinks_) dropped += sink->discard();
  if (dropped == 0) return;
  // Only if stderr takes the note now: it may be what stalled.
  OutputSink& err = standard_sink(2);
  err.write("braid-launch: dropped " + std::to_string(dropped) +
            " bytes of output that stdout/stderr did not take in time\n");
  err.discard();
}

}  // namespace braid::launcher
