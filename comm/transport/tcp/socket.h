// Private helpers of the TCP transport: socket options and non-blocking
// vectored I/O on a connected socket's file descriptor.
#pragma once

#include "comm/transport/transport_only.h"

#include <sys/uio.h>

#include <cstddef>
#include <string>

namespace braid::comm::tcp {

// TCP_NODELAY, SO_SNDBUF/SO_RCVBUF of `buffer_bytes`, O_NONBLOCK.
void tune_socket(int fd, std::size_t buffer_bytes);

// TCP_QUICKACK, re-armed after reads: Linux drops back to delayed ACKs after
// a while, which stalls mid-size ping-pong traffic for up to 40 ms.
void quick_ack(int fd);

// Result of one non-blocking readv/writev: bytes moved (0 when the call would
// block), or closed/failed with errno.
struct IoResult {
  std::size_t bytes = 0;
  bool closed = false;  // orderly shutdown by the peer (read returned 0)
  int error = 0;        // errno of a failed call other than EAGAIN/EINTR
};
IoResult read_some(int fd, iovec* iov, int iov_count);
IoResult write_some(int fd, const iovec* iov, int iov_count);

// Advances an iovec array past `bytes` consumed bytes; returns the new start.
iovec* advance(iovec* iov, int& iov_count, std::size_t bytes);

}  // namespace braid::comm::tcp
