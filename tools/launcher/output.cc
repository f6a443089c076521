// How an OutputSink writes without blocking.
//
// Setting O_NONBLOCK on fd 1 or 2 themselves is not an option: the flag
// belongs to the open file description, which the launcher shares with
// whoever else holds it (the shell and every other process on the same
// terminal, the other commands of a pipeline). They would see EAGAIN, and
// they would keep seeing it if the launcher died before clearing the flag.
// So each kind of destination gets a way of its own:
//   - a pipe, FIFO or terminal is opened again through /proc/self/fd/N:
//     that is a new open file description of the same pipe or terminal,
//     ours alone, and O_NONBLOCK on it affects nobody else;
//   - a socket takes MSG_DONTWAIT on each send(2), which changes nothing
//     shared either;
//   - a regular file (or block device) is written plainly: the kernel never
//     makes a writer to one wait for a reader;
//   - where the reopening fails (no /proc, a descriptor we may not open),
//     poll(2) with a zero timeout comes before each write of at most
//     PIPE_BUF bytes. A pipe that polls writable has room for that much, so
//     this does not block; a terminal may still block when it has less
//     room than that, which is the best that can be done without the flag.
#include "tools/launcher/output.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/kcmp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <optional>
#include <vector>

#include "runtime/log.h"

namespace braid::launcher {
namespace {

bool is_file(const struct stat& info) { return S_ISREG(info.st_mode) || S_ISBLK(info.st_mode); }

// Both descriptors write to one place, so one sink must order their lines:
// one pipe or terminal, or one open file description (`> log 2>&1`: one
// offset, asked of the kernel with kcmp). Two separate opens of one regular
// file are left apart: each has its own offset, which one sink would mix.
bool same_destination(int a, int b) {
  struct stat info_a {}, info_b {};
  if (fstat(a, &info_a) != 0 || fstat(b, &info_b) != 0) return false;
  if (info_a.st_dev != info_b.st_dev || info_a.st_ino != info_b.st_ino) return false;
  if (!is_file(info_a)) return true;
  const pid_t self = getpid();
  return ::syscall(SYS_kcmp, self, self, KCMP_FILE, a, b) == 0;
}

struct StandardSinks {
  OutputSink out{STDOUT_FILENO};
  std::optional<OutputSink> err;  // empty when stderr shares stdout's sink

  StandardSinks() {
    if (!same_destination(STDOUT_FILENO, STDERR_FILENO)) err.emplace(STDERR_FILENO);
  }
};

StandardSinks& standard_sinks() {
  static StandardSinks sinks;
  return sinks;
}

}  // namespace

Clock::time_point deadline_after(Clock::time_point start, Clock::duration duration) {
  if (duration > Clock::time_point::max() - start) return Clock::time_point::max();
  return start + duration;
}

int poll_timeout_ms(std::optional<Clock::time_point> deadline, Clock::time_point now) {
  if (!deadline) return -1;
  if (*deadline <= now) return 0;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - now).count();
  return static_cast<int>(std::min<long long>(left, INT_MAX));
}

OutputSink::OutputSink(int fd) : fd_(fd), is_terminal_(isatty(fd) == 1) {
  struct stat info {};
  if (fstat(fd, &info) != 0 || is_file(info)) return;  // kPlain (a bad fd fails as it did)
  if (S_ISSOCK(info.st_mode)) {
    mode_ = Mode::kSocket;
    return;
  }
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  private_fd_.reset(::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  mode_ = private_fd_.valid() ? Mode::kPrivateNonblocking : Mode::kPollFirst;
}

void OutputSink::write(std::string text) {
  if (text.empty()) return;
  std::lock_guard lock(mu_);
  if (pending_bytes_ + text.size() > kMaxOwnPendingBytes) {
    ++dropped_own_;
    dropped_own_bytes_ += text.size();
    return;
  }
  if (open_writer_ != 0) {
    text.insert(text.begin(), '\n');
    open_writer_ = 0;
  }
  queue_locked(std::move(text));
}

bool OutputSink::write_piece(std::uint64_t writer, std::string_view prefix, std::string_view body, LineEnd end) {
  std::lock_guard lock(mu_);
  const bool continuing = open_writer_ == writer;
  // Nothing to say: a '\r' at the start of a line, or a second one.
  if (body.empty() && end == LineEnd::kReturn && (!continuing || open_at_start_)) return false;
  if (body.empty() && end == LineEnd::kOpen) return false;
  std::string text;
  text.reserve(1 + prefix.size() + body.size() + 1);
  if (open_writer_ != 0 && !continuing) text.push_back('\n');
  // After a '\r' the prefix was gone over; the newline that follows one
  // ("\r\n" split across reads) needs none.
  const bool prefixed = !continuing || (open_at_start_ && !(body.empty() && end == LineEnd::kNewline));
  if (prefixed) text.append(prefix);
  text.append(body);
  switch (end) {
    case LineEnd::kNewline:
      text.push_back('\n');
      open_writer_ = 0;
      break;
    case LineEnd::kReturn:
      text.push_back('\r');
      open_writer_ = writer;
      open_at_start_ = true;
      break;
    case LineEnd::kOpen:
      open_writer_ = writer;
      open_at_start_ = false;
      break;
  }
  queue_locked(std::move(text));
  return true;
}

void OutputSink::close_line(std::uint64_t writer) {
  std::lock_guard lock(mu_);
  if (open_writer_ != writer || writer == 0) return;
  open_writer_ = 0;
  queue_locked("\n");
}

void OutputSink::terminal_line_ended() {
  std::lock_guard lock(mu_);
  if (is_terminal_) open_writer_ = 0;
}

void OutputSink::queue_locked(std::string text) {
  bool was_idle = pending_.empty() || holds_ > 0;
  pending_bytes_ += text.size();
  // Short pieces join the last one queued, so that they go out in one
  // write; up to PIPE_BUF, so that what was one write to a pipe stays one
  // (all or nothing: never split by another process's write to it).
  if (!pending_.empty() && pending_.back().size() + text.size() <= PIPE_BUF &&
      (pending_.size() > 1 || front_written_ == 0))
    pending_.back().append(text);
  else
    pending_.push_back(std::move(text));
  // Behind a backlog the destination has just refused bytes: wait for
  // POLLOUT rather than try (and fail) once per line.
  if (was_idle && holds_ == 0) flush_locked();
}

OutputSink::Hold::Hold(OutputSink& sink) : sink_(sink) {
  std::lock_guard lock(sink_.mu_);
  ++sink_.holds_;
}

OutputSink::Hold::~Hold() {
  std::lock_guard lock(sink_.mu_);
  if (--sink_.holds_ == 0) sink_.flush_locked();
}

void OutputSink::flush() {
  std::lock_guard lock(mu_);
  flush_locked();
}

void OutputSink::flush_locked() {
  while (!pending_.empty()) {
    std::string_view rest = std::string_view(pending_.front()).substr(front_written_);
    ssize_t n = write_some(rest);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      // EPIPE and the like: there is nowhere left to report it.
      if (n < 0 && errno == EPIPE) reader_gone_.store(true, std::memory_order_relaxed);
      discard_locked();
      return;
    }
    front_written_ += static_cast<std::size_t>(n);
    pending_bytes_ -= static_cast<std::size_t>(n);
    if (front_written_ == pending_.front().size()) {
      pending_.pop_front();
      front_written_ = 0;
    }
    if (pending_.empty() && dropped_own_ > 0) {
      std::string note = std::string(open_writer_ != 0 ? "\n" : "") + "braid-launch: dropped " +
                         std::to_string(dropped_own_) + " of its own message(s) (" +
                         std::to_string(dropped_own_bytes_) + " bytes) while this output was not read\n";
      open_writer_ = 0;
      dropped_own_ = dropped_own_bytes_ = 0;
      pending_bytes_ += note.size();
      pending_.push_back(std::move(note));
    }
  }
}

std::size_t OutputSink::discard() {
  std::lock_guard lock(mu_);
  return discard_locked();
}

std::size_t OutputSink::discard_locked() {
  std::size_t dropped = pending_bytes_;
  pending_.clear();
  front_written_ = 0;
  pending_bytes_ = 0;
  return dropped;
}

int OutputSink::poll_fd() const { return mode_ == Mode::kPrivateNonblocking ? private_fd_.get() : fd_; }

ssize_t OutputSink::write_some(std::string_view text) {
  switch (mode_) {
    case Mode::kSocket:
      return ::send(fd_, text.data(), text.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    case Mode::kPrivateNonblocking:
      return ::write(private_fd_.get(), text.data(), text.size());
    case Mode::kPollFirst: {
      pollfd ready{fd_, POLLOUT, 0};
      int polled = ::poll(&ready, 1, 0);
      if (polled < 0) return -1;
      if (polled == 0) {
        errno = EAGAIN;
        return -1;
      }
      return ::write(fd_, text.data(), std::min<std::size_t>(text.size(), PIPE_BUF));
    }
    case Mode::kPlain:
      break;
  }
  return ::write(fd_, text.data(), text.size());
}

std::string rank_line_prefix(int rank) { return "[rank " + std::to_string(rank) + "] "; }

OutputSink& standard_sink(int fd) {
  StandardSinks& sinks = standard_sinks();
  return fd == STDERR_FILENO && sinks.err ? *sinks.err : sinks.out;
}

void say(const std::string& message) { standard_sink(STDERR_FILENO).write("braid-launch: " + message + "\n"); }

void log_without_blocking() {
  runtime::log_through([](std::string_view line) { standard_sink(STDERR_FILENO).write(std::string(line)); });
}

void drain_output(std::chrono::milliseconds limit) {
  const Clock::time_point deadline = deadline_after(Clock::now(), limit);
  std::vector<OutputSink*> sinks{&standard_sink(STDOUT_FILENO)};
  if (&standard_sink(STDERR_FILENO) != sinks[0]) sinks.push_back(&standard_sink(STDERR_FILENO));
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<OutputSink*> waiting;
    for (OutputSink* sink : sinks) {
      if (!sink->has_pending()) continue;
      fds.push_back({sink->poll_fd(), POLLOUT, 0});
      waiting.push_back(sink);
    }
    const Clock::time_point now = Clock::now();
    if (waiting.empty() || now >= deadline) break;
    if (::poll(fds.data(), fds.size(), poll_timeout_ms(deadline, now)) < 0 && errno != EINTR) break;
    for (std::size_t i = 0; i < waiting.size(); ++i)
      if (fds[i].revents != 0) waiting[i]->flush();
  }
  for (OutputSink* sink : sinks) sink->discard();
}

namespace {

// The bytes at the end of text that begin a UTF-8 character not yet
// complete: held back from a partial flush, so that the piece never ends
// inside a character (another writer's newline could land there).
std::size_t incomplete_utf8_tail(std::string_view text) {
  for (std::size_t back = 1; back <= 3 && back <= text.size(); ++back) {
    const auto byte = static_cast<unsigned char>(text[text.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    std::size_t length = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1;
    return length > back ? back : 0;
  }
  return 0;
}

std::atomic<std::uint64_t> next_relay_id{1};

}  // namespace

LineRelay::LineRelay(std::string prefix, OutputSink& sink)
    : id_(next_relay_id.fetch_add(1)), prefix_(std::move(prefix)), sink_(&sink) {}

void LineRelay::feed(std::string_view text, Clock::time_point now) {
  if (text.empty()) return;
  OutputSink::Hold hold(*sink_);
  only_held_tail_ = false;
  // A '\r' that ended the last read: a line end of its own ("\r\n"), or
  // a return to the line's start.
  if (!pending_.empty() && pending_.back() == '\r' && text.front() != '\n') {
    pending_.pop_back();
    emit(pending_, OutputSink::LineEnd::kReturn);
    pending_.clear();
  }
  while (!text.empty()) {
    std::size_t end = text.find_first_of("\r\n");
    if (end == std::string_view::npos || (text[end] == '\r' && end + 1 == text.size())) {
      if (pending_.empty()) pending_began_ = now;
      pending_last_ = now;
      pending_.append(text);
      if (pending_.size() >= kMaxLineBytes) flush_partial();
      return;
    }
    if (text[end] == '\r' && text[end + 1] != '\n') {
      pending_.append(text.substr(0, end));
      emit(pending_, OutputSink::LineEnd::kReturn);
      pending_.clear();
      text.remove_prefix(end + 1);
      continue;
    }
    // '\n', or "\r\n" (its '\r' stays in the line, as the rank wrote it).
    std::size_t newline = text[end] == '\n' ? end : end + 1;
    pending_.append(text.substr(0, newline));
    emit(pending_, OutputSink::LineEnd::kNewline);
    pending_.clear();
    text.remove_prefix(newline + 1);
  }
}

std::optional<Clock::time_point> LineRelay::partial_deadline() const {
  if (pending_.empty() || only_held_tail_) return std::nullopt;
  return std::min(pending_last_ + kPartialLineWait, pending_began_ + kLongestPartialWait);
}

void LineRelay::flush_partial() {
  if (pending_.empty()) return;
  if (pending_.back() == '\r') {
    pending_.pop_back();
    emit(pending_, OutputSink::LineEnd::kReturn);
    pending_.clear();
    return;
  }
  // The start of a character waits for its rest (or the stream's end,
  // finish): written alone, another rank's line could land inside it.
  const std::size_t held = incomplete_utf8_tail(pending_);
  emit(std::string_view(pending_).substr(0, pending_.size() - held), OutputSink::LineEnd::kOpen);
  pending_.erase(0, pending_.size() - held);
  only_held_tail_ = !pending_.empty();
}

void LineRelay::finish() {
  if (pending_.empty() && !line_begun_) return;
  emit(pending_, OutputSink::LineEnd::kNewline);
  pending_.clear();
}

void LineRelay::emit(std::string_view body, OutputSink::LineEnd end) {
  // The bare end of a line already begun: no line of its own (just a
  // prefix) when another writer has ended it meanwhile.
  if (body.empty() && end == OutputSink::LineEnd::kNewline && line_begun_) {
    sink_->close_line(id_);
    line_begun_ = false;
    return;
  }
  // A piece that wrote nothing (a '\r' at a line's start) begins no line.
  if (sink_->write_piece(id_, prefix_, body, end)) line_begun_ = end != OutputSink::LineEnd::kNewline;
}

}  // namespace braid::launcher
