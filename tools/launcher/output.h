// What braid-launch prints: its own messages, and the ranks' output relayed
// line by line with a "[rank r] " prefix.
//
// A line a rank has not finished is not held back for ever: a prompt
// (`input("name? ")`) or a progress bar redrawn with '\r' (tqdm) shows
// once the rank has written nothing more for kPartialLineWait (or
// kLongestPartialWait after the line began). The rest of
// that line follows without a second prefix, unless another writer comes
// between: its text then starts on a line of its own, and the rank's rest
// gets its prefix again. A '\r' ends a piece at once, and the piece after it
// is prefixed again, since the terminal's cursor went back over the prefix.
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
// supervising its ranks. It closes their pipes to that destination, though
// (Supervisor), so that a rank's next write there fails as it would
// without the launcher between (SIGPIPE, or Python's BrokenPipeError):
// relaying into nothing, it left a job piped into `head` running to its end
// with nothing shown.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
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
  // has room, with the pieces queued before and after it up to PIPE_BUF
  // bytes) and writes what the destination takes now. Text that is not
  // a rank's goes on a line of its own. Past kMaxOwnPendingBytes pending
  // (nothing reads the destination, and something, a flood on the store's
  // port say, keeps the launcher talking) the text is dropped and counted,
  // and the count is written once the destination takes output again.
  static constexpr std::size_t kMaxOwnPendingBytes = 4u << 20;
  void write(std::string text);

  // How a piece of a rank's line ends: with the line, with a '\r', or open
  // (the rank has written no more of the line yet).
  enum class LineEnd { kNewline, kReturn, kOpen };
  // Queues a piece of the current line of `writer` (a LineRelay's id, not
  // 0): prefixed when it starts the line or follows a '\r', and put on a
  // line of its own when another writer's line is open. False when there
  // was nothing to write (an empty piece, a '\r' at a line's start).
  bool write_piece(std::uint64_t writer, std::string_view prefix, std::string_view body, LineEnd end);
  // Ends the writer's open line, if it is the open one, with a newline.
  void close_line(std::uint64_t writer);
  // The user ended a line typed on the terminal: when this sink writes to
  // that terminal, its echo ended the open line, and what follows starts
  // a line of its own.
  void terminal_line_ended();
  // Writes pending pieces while the destination takes them.
  void flush();
  // While one lives, pieces queued wait for its end to be written: the
  // lines of one read of a rank's pipe go out in writes of up to PIPE_BUF
  // bytes, not one write(2) each (2 million short lines took 4 s).
  class Hold {
   public:
    explicit Hold(OutputSink& sink);
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    OutputSink& sink_;
  };
  // Drops the pending output; returns how many bytes that was.
  std::size_t discard();

  bool has_pending() const { return pending_bytes() > 0; }
  // A write failed with EPIPE: nothing reads the destination any more.
  bool reader_gone() const { return reader_gone_.load(std::memory_order_relaxed); }
  bool full() const { return pending_bytes() >= kMaxPendingBytes; }
  std::size_t pending_bytes() const { return pending_bytes_.load(std::memory_order_relaxed); }
  // The descriptor to poll for POLLOUT while output is pending.
  int poll_fd() const;

 private:
  enum class Mode { kPlain, kSocket, kPrivateNonblocking, kPollFirst };
  ssize_t write_some(std::string_view text);
  void queue_locked(std::string text);
  void flush_locked();
  std::size_t discard_locked();

  int fd_;
  bool is_terminal_;
  Mode mode_ = Mode::kPlain;
  UniqueFd private_fd_;  // kPrivateNonblocking: our own open of fd_'s file
  // Any thread may write (the launcher's log lines come from its store's
  // thread too); the supervisor flushes.
  std::mutex mu_;
  std::deque<std::string> pending_;
  std::size_t front_written_ = 0;  // bytes of pending_.front() already written
  std::atomic<std::size_t> pending_bytes_{0};
  std::atomic<bool> reader_gone_{false};
  // The writer whose line was left open (a piece without its newline), and
  // whether its last piece ended with '\r' (the cursor at the line's start).
  std::uint64_t open_writer_ = 0;
  bool open_at_start_ = false;
  int holds_ = 0;  // Holds alive
  std::size_t dropped_own_ = 0, dropped_own_bytes_ = 0;  // write()'s texts dropped, not yet told
};

// What each line of rank `rank`'s relayed output begins with: "[rank 1] ".
// The rank is told it (BRAID_LINE_PREFIX), so that braid's logger in it
// does not tag its lines with the rank a second time.
std::string rank_line_prefix(int rank);

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
  // Beyond this many bytes without a newline the pending text is written
  // out as an open piece, so a rank that never prints '\n' cannot grow the
  // launcher's memory without bound. 1 MiB, not a pipe's 64 KiB: a JSON
  // line of 70 KB written at once was cut in two, another rank's line
  // between (a review helper's case).
  static constexpr std::size_t kMaxLineBytes = 1u << 20;
  // How long an unfinished line waits for more before it is written out
  // (flush_partial): kPartialLineWait after its last byte, long enough that
  // a line written in a few pieces stays whole, short enough that a prompt
  // seems to appear at once; and at most kLongestPartialWait after its
  // first, so that a rank printing a dot now and then shows them.
  static constexpr std::chrono::milliseconds kPartialLineWait{100};
  static constexpr std::chrono::milliseconds kLongestPartialWait{1000};

  LineRelay(std::string prefix, OutputSink& sink);

  // Writes every complete line, and every piece ended by '\r', in the
  // text; keeps the unterminated rest.
  void feed(std::string_view text, Clock::time_point now = Clock::now());
  // When the unterminated rest is due to be written (kPartialLineWait after
  // its last byte, kLongestPartialWait after its first); none without one.
  std::optional<Clock::time_point> partial_deadline() const;
  // Writes the unterminated rest as an open piece, but for the bytes of a
  // UTF-8 character not yet complete, which wait for the rest (or finish).
  void flush_partial();
  // Puts the unterminated rest's deadline kPartialLineWait after now.
  void wait_longer(Clock::time_point now) { pending_began_ = pending_last_ = now; }
  // Writes the unterminated rest, if any, and ends the line.
  void finish();
  OutputSink& sink() const { return *sink_; }

 private:
  void emit(std::string_view body, OutputSink::LineEnd end);

  std::uint64_t id_;  // the sink's name for this relay's lines
  std::string prefix_;
  OutputSink* sink_;
  std::string pending_;
  Clock::time_point pending_began_{}, pending_last_{};  // the rest's first and last bytes came
  bool line_begun_ = false;      // a piece of the current line went out
  bool only_held_tail_ = false;  // pending_ is the start of a UTF-8 character, flushed up to it
};

}  // namespace braid::launcher
