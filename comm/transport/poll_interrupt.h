// PollInterrupt: the wake-up of a transport whose progress() sleeps in
// ppoll (tcp, ibverbs). interrupt() may come from any thread and is
// sticky: the descriptor stays readable until the sleeper clears it, so a
// wake-up raised just before the sleep begins is not lost.
#pragma once

#include "comm/transport/transport_only.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "runtime/errors.h"

namespace braid::comm {

class PollInterrupt {
 public:
  PollInterrupt() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw SystemError(std::string("cannot create the transport's wake-up eventfd: ") + std::strerror(errno));
  }
  ~PollInterrupt() { ::close(fd_); }
  PollInterrupt(const PollInterrupt&) = delete;
  PollInterrupt& operator=(const PollInterrupt&) = delete;

  // Watch it with POLLIN beside the transport's own descriptors.
  int fd() const { return fd_; }
  void raise() {
    const std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof one);  // fails only at a counter near 2^64
  }
  void clear() {
    std::uint64_t count;
    [[maybe_unused]] ssize_t n = ::read(fd_, &count, sizeof count);  // EAGAIN: nothing raised
  }

 private:
  int fd_;
};

}  // namespace braid::comm
