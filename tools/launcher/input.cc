#include "tools/launcher/input.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include <spdlog/spdlog.h>

namespace braid::launcher {

InputRelay::InputRelay(int source) : source_(source), source_is_terminal_(isatty(source) == 1) {}

UniqueFd InputRelay::connect() {
  Pipe pipe = make_pipe();
  // Only the launcher's end is non-blocking: the rank reads as from any
  // stdin.
  int flags = fcntl(pipe.write_end.get(), F_GETFL);
  if (flags < 0 || fcntl(pipe.write_end.get(), F_SETFL, flags | O_NONBLOCK) != 0)
    throw SystemError(errno_message("fcntl(O_NONBLOCK) on the stdin pipe", errno));
  target_ = std::move(pipe.write_end);
  close_target_if_done();
  return std::move(pipe.read_end);
}

// A terminal that is not the launcher's controlling one (under setsid)
// has no foreground for it: tcgetpgrp fails with ENOTTY, and reading it
// stops no one, so it is read.
bool InputRelay::in_background() const {
  if (!source_is_terminal_) return false;
  const pid_t foreground = tcgetpgrp(source_);
  return foreground != -1 && foreground != getpgrp();
}

int InputRelay::source_poll_fd() const {
  if (source_ended_ || !target_.valid() || pending_.size() >= kMaxPendingBytes || in_background()) return -1;
  return source_;
}

int InputRelay::target_poll_fd() const { return target_.valid() && !pending_.empty() ? target_.get() : -1; }

std::optional<InputRelay::Clock::time_point> InputRelay::recheck_deadline(Clock::time_point now) const {
  if (source_ended_ || !target_.valid() || !in_background()) return std::nullopt;
  return now + kForegroundRecheck;
}

bool InputRelay::read_source() {
  char buffer[16 << 10];
  const std::size_t room = kMaxPendingBytes - std::min(pending_.size(), kMaxPendingBytes);
  ssize_t n = ::read(source_, buffer, std::min(sizeof buffer, room));
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return false;
  // EIO: put in the background between the check and the read.
  if (n < 0 && errno == EIO && source_is_terminal_) return false;
  if (n < 0) spdlog::debug("braid-launch: reading stdin: {}; the rank's stdin ends here", std::strerror(errno));
  if (n <= 0) {
    source_ended_ = true;
    close_target_if_done();
    return false;
  }
  pending_.append(buffer, static_cast<std::size_t>(n));
  write_target();
  return source_is_terminal_ && std::string_view(buffer, static_cast<std::size_t>(n)).find('\n') != std::string_view::npos;
}

void InputRelay::write_target() {
  while (target_.valid() && !pending_.empty()) {
    ssize_t n = ::write(target_.get(), pending_.data(), pending_.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      // EPIPE: the rank closed its stdin or ended; it reads no more.
      target_.reset();
      pending_.clear();
      return;
    }
    pending_.erase(0, static_cast<std::size_t>(n));
  }
  close_target_if_done();
}

void InputRelay::close_target_if_done() {
  if (source_ended_ && pending_.empty()) target_.reset();
}

}  // namespace braid::launcher
