#include "tools/launcher/output.h"

#include <unistd.h>

#include <cerrno>

namespace braid::launcher {

void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

void say(const std::string& message) {
  write_all(2, "braid-launch: " + message + "\n");
}

LineRelay::LineRelay(std::string prefix, int dest_fd)
    : prefix_(std::move(prefix)), dest_fd_(dest_fd) {}

void LineRelay::feed(std::string_view text) {
  while (!text.empty()) {
    std::size_t newline = text.find('\n');
    if (newline == std::string_view::npos) {
      pending_.append(text);
      if (pending_.size() >= kMaxLineBytes) finish();
      return;
    }
    pending_.append(text.substr(0, newline));
    emit(pending_);
    pending_.clear();
    text.remove_prefix(newline + 1);
  }
}

void LineRelay::finish() {
  if (pending_.empty()) return;
  emit(pending_);
  pending_.clear();
}

void LineRelay::emit(std::string_view line) {
  std::string out;
  out.reserve(prefix_.size() + line.size() + 1);
  out.append(prefix_).append(line).push_back('\n');
  write_all(dest_fd_, out);
}

}  // namespace braid::launcher
