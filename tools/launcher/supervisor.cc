#include "tools/launcher/supervisor.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "tools/launcher/launcher.h"

namespace braid::launcher {
namespace {

// Once every rank is reaped its group has been killed, so its pipes reach
// end-of-file at once; this bounds the wait for a descendant that left the
// group (setsid) and still holds one.
constexpr std::chrono::milliseconds kDrainTime{2000};

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
                       std::chrono::milliseconds grace_period, Clock::time_point started)
    : signals_(signals), timeout_(timeout), grace_period_(grace_period) {
  if (timeout.count() > 0) job_deadline_ = started + timeout;
}

void Supervisor::add(RankProcess process) {
  std::string prefix = "[rank " + std::to_string(process.rank) + "] ";
  ranks_.push_back(Rank{process.rank, process.pid, true,
                        Stream{std::move(process.stdout_pipe), LineRelay(prefix, 1)},
                        Stream{std::move(process.stderr_pipe), LineRelay(prefix, 2)}});
}

void Supervisor::abort(int exit_status) {
  exit_status_ = exit_status;
  stopping_ = true;
  signal_running(SIGKILL);
}

int Supervisor::run() {
  while (!done()) {
    wait_for_events();
    handle_deadlines();
  }
  finish_streams();
  return exit_status_;
}

void Supervisor::wait_for_events() {
  std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
  std::vector<Stream*> streams;
  for (Rank& rank : ranks_) {
    for (Stream* stream : {&rank.out, &rank.err}) {
      if (!stream->fd.valid()) continue;
      fds.push_back({stream->fd.get(), POLLIN, 0});
      streams.push_back(stream);
    }
  }
  if (::poll(fds.data(), fds.size(), poll_timeout_ms()) < 0) {
    if (errno == EINTR) return;
    throw SystemError(errno_message("poll", errno));
  }
  // Output first: a rank's last lines are already in its pipe when its
  // SIGCHLD arrives, and reaping does not lose them either way.
  for (std::size_t i = 0; i < streams.size(); ++i)
    if (fds[i + 1].revents != 0) read_stream(*streams[i]);
  if (fds[0].revents != 0) handle_signals();
}

int Supervisor::poll_timeout_ms() const {
  std::optional<Clock::time_point> nearest;
  auto consider = [&](const std::optional<Clock::time_point>& deadline) {
    if (deadline && (!nearest || *deadline < *nearest)) nearest = deadline;
  };
  if (!stopping_) consider(job_deadline_);
  consider(kill_deadline_);
  if (running_count() == 0) consider(drain_deadline_);
  if (!nearest) return -1;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(*nearest - Clock::now());
  return static_cast<int>(std::max<long long>(0, left.count()));
}

void Supervisor::handle_signals() {
  for (int signo : signals_.take()) {
    if (signo == SIGCHLD)
      reap_exited();
    else
      on_launcher_signal(signo);
  }
}

void Supervisor::reap_exited() {
  for (Rank& rank : ranks_) {
    if (!rank.running) continue;
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(rank.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        info.si_pid == 0)
      continue;
    // While the rank is an unreaped zombie its pid, and so its group id,
    // cannot be reused: kill what it left behind in its group, then reap.
    signal_group(rank.pid, SIGKILL);
    int status = 0;
    while (waitpid(rank.pid, &status, 0) < 0 && errno == EINTR) {
    }
    rank.running = false;
    on_rank_exit(rank, decode_wait_status(status));
  }
}

void Supervisor::on_rank_exit(const Rank& rank, const ExitStatus& status) {
  if (status.success() || stopping_) return;
  int others = running_count();
  std::string line = "rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) +
                     ") " + describe(status);
  if (others == 1) line += "; stopping the other rank";
  if (others > 1) line += "; stopping the other " + count_of_ranks(others);
  say(line);
  exit_status_ = status.shell_status();
  rank_failed_ = true;
  stop(SIGTERM);
}

void Supervisor::on_launcher_signal(int signo) {
  interrupted_ = true;
  int running = running_count();
  if (running == 0) return;
  if (stopping_) {
    say("received " + signal_name(signo) + " while stopping; killing the remaining " +
        count_of_ranks(running) + " now");
    signal_running(SIGKILL);
    return;
  }
  say("received " + signal_name(signo) + "; forwarding it to " + count_of_ranks(running));
  exit_status_ = 128 + signo;
  stop(signo);
}

void Supervisor::handle_deadlines() {
  auto now = Clock::now();
  if (!stopping_ && job_deadline_ && now >= *job_deadline_) {
    say("the job ran past its --timeout of " + seconds_text(timeout_) + "; stopping " +
        count_of_ranks(running_count()));
    exit_status_ = kExitTimeout;
    interrupted_ = true;
    stop(SIGTERM);
  }
  if (kill_deadline_ && now >= *kill_deadline_) {
    kill_deadline_.reset();
    if (int running = running_count(); running > 0) {
      say(count_of_ranks(running) + " still running " + seconds_text(grace_period_) +
          " after being told to stop; sending SIGKILL");
      signal_running(SIGKILL);
    }
  }
  if (running_count() == 0 && !drain_deadline_) drain_deadline_ = now + kDrainTime;
}

void Supervisor::stop(int signo) {
  stopping_ = true;
  signal_running(signo);
  kill_deadline_ = Clock::now() + grace_period_;
}

void Supervisor::signal_running(int signo) {
  for (const Rank& rank : ranks_)
    if (rank.running) signal_group(rank.pid, signo);
}

int Supervisor::running_count() const {
  int count = 0;
  for (const Rank& rank : ranks_) count += rank.running ? 1 : 0;
  return count;
}

bool Supervisor::done() const {
  if (running_count() > 0) return false;
  for (const Rank& rank : ranks_)
    if (rank.out.fd.valid() || rank.err.fd.valid()) return drain_deadline_ && Clock::now() >= *drain_deadline_;
  return true;
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

void Supervisor::finish_streams() {
  for (Rank& rank : ranks_) {
    for (Stream* stream : {&rank.out, &rank.err}) {
      stream->relay.finish();
      stream->fd.reset();
    }
  }
}

}  // namespace braid::launcher
