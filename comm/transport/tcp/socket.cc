#include "comm/transport/tcp/socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "runtime/errors.h"

namespace braid::comm::tcp {

void tune_socket(int fd, std::size_t buffer_bytes) {
  int one = 1;
  int buffer = static_cast<int>(buffer_bytes);
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer) != 0)
    throw SystemError(errno_message("setting TCP socket options", errno));
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    throw SystemError(errno_message("making a TCP socket non-blocking", errno));
}

void quick_ack(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
}

IoResult read_some(int fd, iovec* iov, int iov_count) {
  for (;;) {
    ssize_t n = readv(fd, iov, iov_count);
    if (n > 0) return {static_cast<std::size_t>(n), false, 0};
    if (n == 0) return {0, true, 0};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
    return {0, false, errno};
  }
}

IoResult write_some(int fd, const iovec* iov, int iov_count) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<std::size_t>(iov_count);
  for (;;) {
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);  // a dead peer is an error, not SIGPIPE
    if (n >= 0) return {static_cast<std::size_t>(n), false, 0};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
    return {0, false, errno};
  }
}

iovec* advance(iovec* iov, int& iov_count, std::size_t bytes) {
  while (iov_count > 0 && bytes >= iov->iov_len) {
    bytes -= iov->iov_len;
    ++iov;
    --iov_count;
  }
  if (iov_count > 0 && bytes > 0) {
    iov->iov_base = static_cast<char*>(iov->iov_base) + bytes;
    iov->iov_len -= bytes;
  }
  return iov;
}

}  // namespace braid::comm::tcp
