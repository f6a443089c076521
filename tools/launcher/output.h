// What braid-launch prints: its own messages, and the ranks' output relayed
// line by line with a "[rank r] " prefix.
//
// The launcher never blocks on its own stdout or stderr: a reader that
// stalls (`braid-launch ... | less`, a terminal paused with Ctrl-S, a stuck
// log pipe) must not freeze the supervisor, whose timers and signals would
// stop with it. Everything written to one destination goes through one
// OutputSink: what the destination takes now is written at once, the rest
// waits, in order, in a bounded buffer that the supervisor flushes when
// poll(2) says the destination is writable. While the buffer is full the
// supervisor stops reading the ranks' pipes, so the ranks block on their
// own writes (backpressure) and nothing is lost while the job runs.
//
// Each line, and each message, goes out in one write(2) of its own (only a
// line longer than the destination takes at once is split, across writes
// that follow each other), so lines of different ranks never mix inside a
// line. Output to a closed stdout (`braid-launch ... | head`) is dropped
// rather than killing the launcher: the launcher ignores SIGPIPE and keeps
// supervising its ranks.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "tools/launcher/process.h"

namespace braid::launcher {

using Clock = std::chrono::steady_clock;

// start + duration, saturating at the clock's end instead of overflowing.
Clock::time_point deadline_after(Clock::time_point start, Clock::duration duration);
// The timeout for poll(2) until the deadline: -1 without one, 0 once it
// has passed, at most INT_MAX (about 24.8 days; poll then returns early and
// the caller computes it again).
int poll_timeout_ms(std::optional<Clock::time_point> deadline, Clock::time_point now);

// One destination (the launcher's stdout or stderr), written without ever
// blocking.
class OutputSink {
 public:
  // Past this many pending bytes the sink is full: the supervisor stops
  // reading output for it until it drains. One read of a rank's pipe may
  // still add its lines beyond the mark, so the buffer stays within about
  // 2 MiB.
  static constexpr std::size_t kMaxPendingBytes = 1u << 20;

  // Writes to fd, which stays owned by the caller and open while the sink
  // lives.
  explicit OutputSink(int fd);
  OutputSink(const OutputSink&) = delete;
  OutputSink& operator=(const OutputSink&) = delete;

  // Queues text as one piece (written in one write(2) when the destination
  // has room) and writes what the destination takes now.
  void write(std::string text);
  // Writes pending pieces while the destination takes them.
  void flush();
  // Drops the pending output; returns how many bytes that was.
  std::size_t discard();

  bool has_pending() const { return pending_bytes() > 0; }
  bool full() const { return pending_bytes() >= kMaxPendingBytes; }
  std::size_t pending_bytes() const { return pending_bytes_.load(std::memory_order_relaxed); }
  // The descriptor to poll for POLLOUT while output is pending.
  int poll_fd() const;

 private:
  enum class Mode { kPlain, kSocket, kPrivateNonblocking, kPollFirst };
  ssize_t write_some(std::string_view text);
  void flush_locked();
  std::size_t discard_locked();

  int fd_;
  Mode mode_ = Mode::kPlain;
  UniqueFd private_fd_;  // kPrivateNonblocking: our own open of fd_'s file
  // Any thread may write (the launcher's log lines come from its store's
  // thread too); the supervisor flushes.
  std::mutex mu_;
  std::deque<std::string> pending_;
  std::size_t front_written_ = 0;  // bytes of pending_.front() already written
  std::atomic<std::size_t> pending_bytes_{0};
};

// The sink for the launcher's stdout (fd 1) or stderr (fd 2). Both are one
// sink when they are the same file (`2>&1`, one terminal), so that their
// lines keep their order and never split each other. Process-wide because
// the process has one stdout and one stderr: every writer to them must
// share its buffer.
OutputSink& standard_sink(int fd);

// Prints "braid-launch: <message>" as one line on stderr, without blocking.
void say(const std::string& message);
// Sends the launcher's spdlog lines (its own and its store's) through the
// stderr sink, so that a stalled stderr blocks none of them either.
void log_without_blocking();

// Gives the pending output of stdout and stderr up to `limit` to drain,
// then drops the rest: what braid-launch does last before it exits.
void drain_output(std::chrono::milliseconds limit);

// Splits one stream of one rank into lines and queues each, prefixed, on
// the destination sink.
class LineRelay {
 public:
  // Beyond this many bytes without a newline the pending text is written as
  // a line of its own, so a rank that never prints '\n' cannot grow the
  // launcher's memory without bound.
  static constexpr std::size_t kMaxLineBytes = 64u << 10;

  LineRelay(std::string prefix, OutputSink& sink);

  // Writes every complete line in the text; keeps the unterminated rest.
  void feed(std::string_view text);
  // Writes the unterminated rest, if any, with a newline added.
  void finish();
  OutputSink& sink() const { return *sink_; }

 private:
  void emit(std::string_view line);

  std::string prefix_;
  OutputSink* sink_;
  std::string pending_;
};

}  // namespace braid::launcher
