#include "comm/transport/tcp/transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "comm/transport/tcp/socket.h"
#include "runtime/errors.h"

namespace braid::comm::tcp {
namespace {

constexpr int kMaxIov = 64;
// Receives into caller memory up to this size go through staging (post_recv).
constexpr std::size_t kStagedCallerBytes = 64u << 10;
constexpr std::size_t kHeaderBytes = sizeof(WireHeader);
// A farewell message (farewell()): the reason, at most kFarewellBytes of it.
constexpr std::uint32_t kFarewellMagic = 0x46445242;  // "BRDF"
constexpr std::size_t kFarewellBytes = 2048;

}  // namespace

TcpTransport::TcpTransport(int rank, std::vector<std::vector<int>> fds, std::size_t buffer_bytes,
                           std::chrono::nanoseconds spin)
    : rank_(rank), buffer_bytes_(buffer_bytes), spin_(spin) {
  streams_.resize(fds.size());
  sent_count_.assign(fds.size(), 0);
  received_count_.assign(fds.size(), 0);
  for (std::size_t peer = 0; peer < fds.size(); ++peer) {
    for (int fd : fds[peer]) {
      tune_socket(fd, buffer_bytes_);
      Stream stream;
      stream.fd = fd;
      stream.peer = static_cast<int>(peer);
      streams_[peer].push_back(std::move(stream));
    }
  }
}

TcpTransport::~TcpTransport() { shutdown(); }

// Closing a socket with unread bytes in it resets the connection, and a
// reset throws away what was not yet sent, a farewell with it: the bytes
// waiting are read and dropped first (a bounded amount: a peer still
// sending is reset by the closed socket's next answer instead).
void TcpTransport::shutdown() {
  for (auto& peer_streams : streams_)
    for (auto& stream : peer_streams)
      if (stream.fd >= 0) {
        ::shutdown(stream.fd, SHUT_RDWR);
        char sink[64 << 10];
        for (int reads = 0; reads < 64 && ::recv(stream.fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++reads) {
        }
        ::close(stream.fd);
        stream.fd = -1;
      }
}

// Best effort and never blocking: a socket whose send buffer is full, or
// that is in the middle of a message, gets none (the peer then sees the
// connection close, as before).
void TcpTransport::farewell(const std::string& reason) {
  WireHeader header;
  header.magic = kFarewellMagic;
  header.payload_bytes = std::min(reason.size(), kFarewellBytes);
  for (auto& peer_streams : streams_)
    for (auto& stream : peer_streams) {
      if (stream.fd < 0) continue;
      if (!stream.sends.empty() && requests_[stream.sends.front()].moved > 0) continue;
      iovec iov[2] = {{&header, kHeaderBytes}, {const_cast<char*>(reason.data()), header.payload_bytes}};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      (void)::sendmsg(stream.fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
}

RequestId TcpTransport::allocate(int peer, const WireHeader& header) {
  RequestId id = requests_.acquire();
  Request& r = requests_[id];
  r.peer = peer;
  r.header = header;
  return id;
}

TcpTransport::Stream& TcpTransport::stream_for(int peer, std::vector<std::uint64_t>& counter) {
  auto& peer_streams = streams_.at(static_cast<std::size_t>(peer));
  if (peer_streams.empty())
    throw InvalidUsage("rank " + std::to_string(rank_) + " has no TCP connection to rank " +
                       std::to_string(peer));
  return peer_streams[counter[peer]++ % peer_streams.size()];
}

RequestId TcpTransport::post_send(int peer, const WireHeader& header, const void* data) {
  RequestId id = allocate(peer, header);
  requests_[id].data = static_cast<std::byte*>(const_cast<void*>(data));
  stream_for(peer, sent_count_).sends.push_back(id);
  return id;
}

// A payload bound for caller memory must not land there before its header
// is checked. Up to kStagedCallerBytes it is read with its header in one
// readv into staging and copied over once complete (a copy is cheaper than
// a system call at that size); larger ones read the header alone first.
RequestId TcpTransport::post_recv(int peer, const WireHeader& expected, void* data, Placement) {
  RequestId id = allocate(peer, expected);
  Request& r = requests_[id];
  if (data && expected.payload_bytes > kStagedCallerBytes) {
    r.data = static_cast<std::byte*>(data);
  } else {
    r.copy_to = static_cast<std::byte*>(data);
    r.staging = staging_.take(expected.payload_bytes);
    r.data = r.staging->data();
  }
  stream_for(peer, received_count_).recvs.push_back(id);
  return id;
}

bool TcpTransport::is_done(RequestId request) { return requests_.at(request).done; }

std::span<const std::byte> TcpTransport::view(RequestId request) {
  const Request& r = requests_.at(request);
  return {r.data, static_cast<std::size_t>(r.header.payload_bytes)};
}

void TcpTransport::release(RequestId request) {
  Request& r = requests_.at(request);
  staging_.give_back(std::move(r.staging));
  requests_.release(request);
}

// Writes as many queued messages of this socket as the kernel takes, header
// and payload of several messages gathered into one sendmsg.
bool TcpTransport::pump_sends(Stream& stream) {
  bool advanced = false;
  while (!stream.sends.empty()) {
    iovec iov[kMaxIov];
    int count = 0;
    for (RequestId id : stream.sends) {
      if (count + 2 > kMaxIov) break;
      Request& r = requests_[id];
      std::size_t payload = r.header.payload_bytes;
      if (r.moved < kHeaderBytes)
        iov[count++] = {reinterpret_cast<char*>(&r.header) + r.moved, kHeaderBytes - r.moved};
      std::size_t payload_moved = r.moved > kHeaderBytes ? r.moved - kHeaderBytes : 0;
      if (payload > payload_moved) iov[count++] = {r.data + payload_moved, payload - payload_moved};
    }
    IoResult io = write_some(stream.fd, iov, count);
    if (io.error) fail(stream, "sending to", io.error);
    if (io.bytes == 0) break;
    advanced = true;
    std::size_t left = io.bytes;
    while (left > 0 && !stream.sends.empty()) {
      Request& r = requests_[stream.sends.front()];
      std::size_t total = kHeaderBytes + r.header.payload_bytes;
      std::size_t take = std::min(left, total - r.moved);
      r.moved += take;
      left -= take;
      if (r.moved < total) break;
      r.done = true;
      bytes_sent_.fetch_add(r.header.payload_bytes, std::memory_order_relaxed);
      stream.sends.pop_front();
    }
  }
  return advanced;
}

void TcpTransport::finish_header(Request& r) {
  std::string mismatch = header_mismatch(r.header, r.received, rank_, r.peer);
  if (!mismatch.empty()) throw RemoteError(mismatch, r.peer);
}

// Reads the front receive of this socket, then the next. Into staging,
// header and payload come in one readv (the header is checked before the
// request can complete); into the caller's memory (large receives, see
// post_recv) the header is read and checked alone first, so a mismatched
// message never writes a byte there.
bool TcpTransport::pump_recvs(Stream& stream) {
  bool advanced = false;
  while (!stream.recvs.empty()) {
    Request& r = requests_[stream.recvs.front()];
    std::size_t total = kHeaderBytes + r.header.payload_bytes;
    iovec iov[2];
    int count = 0;
    if (r.moved < kHeaderBytes)
      iov[count++] = {reinterpret_cast<char*>(&r.received) + r.moved, kHeaderBytes - r.moved};
    std::size_t payload_moved = r.moved > kHeaderBytes ? r.moved - kHeaderBytes : 0;
    const bool header_first = !r.staging && r.moved < kHeaderBytes;
    if (r.header.payload_bytes > payload_moved && !header_first)
      iov[count++] = {r.data + payload_moved, r.header.payload_bytes - payload_moved};
    IoResult io = read_some(stream.fd, iov, count);
    if (io.closed) fail(stream, "receiving from", 0);
    if (io.error) fail(stream, "receiving from", io.error);
    if (io.bytes == 0) break;
    advanced = true;
    bool had_header = r.moved >= kHeaderBytes;
    r.moved += io.bytes;
    if (!had_header && r.moved >= kHeaderBytes) {
      if (r.received.magic == kFarewellMagic) {
        std::size_t have = std::min<std::size_t>(r.moved - kHeaderBytes, r.received.payload_bytes);
        throw_farewell(stream, r.received, std::string(reinterpret_cast<const char*>(r.data), r.staging ? have : 0));
      }
      finish_header(r);
    }
    if (r.moved < total) continue;
    quick_ack(stream.fd);
    if (r.copy_to && r.header.payload_bytes) std::memcpy(r.copy_to, r.data, r.header.payload_bytes);
    r.done = true;
    bytes_received_.fetch_add(r.header.payload_bytes, std::memory_order_relaxed);
    stream.recvs.pop_front();
  }
  return advanced;
}

bool TcpTransport::progress(Clock::time_point deadline) {
  auto pump_all = [this] {
    bool advanced = false;
    for (auto& peer_streams : streams_)
      for (auto& stream : peer_streams) {
        if (!stream.sends.empty()) advanced |= pump_sends(stream);
        if (!stream.recvs.empty()) advanced |= pump_recvs(stream);
      }
    return advanced;
  };
  if (pump_all()) return true;
  if (Clock::now() >= deadline) return false;
  // A peer on another core usually answers within microseconds: polling the
  // sockets that long is cheaper than a sleep and a wake-up.
  for (auto spin_end = std::min(deadline, Clock::now() + spin_); Clock::now() < spin_end;)
    if (pump_all()) return true;
  wait_io(deadline);
  return pump_all();
}

// Blocks in ppoll until a socket with queued work is ready or the deadline
// passes. Idle sockets are watched for hang-ups only, so early data from a
// peer that is already in the next operation does not spin this loop.
void TcpTransport::wait_io(Clock::time_point deadline) {
  std::vector<pollfd>& fds = poll_fds_;  // reused: no allocation per wait
  std::vector<Stream*>& owners = poll_owners_;
  fds.clear();
  owners.clear();
  for (auto& peer_streams : streams_)
    for (auto& stream : peer_streams) {
      short events = 0;
      if (!stream.sends.empty()) events |= POLLOUT;
      if (!stream.recvs.empty()) events |= POLLIN;
      if (events == 0 && !stream.hung_up) events = POLLRDHUP;
      if (events == 0 || stream.fd < 0) continue;
      fds.push_back({stream.fd, events, 0});
      owners.push_back(&stream);
    }
  if (fds.empty()) return;
  fds.push_back({interrupt_.fd(), POLLIN, 0});  // interrupt(), last
  owners.push_back(nullptr);
  auto wait = std::max(deadline - Clock::now(), Clock::duration::zero());
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  int ready = ppoll(fds.data(), fds.size(), &ts, nullptr);
  if (ready < 0 && errno != EINTR) throw SystemError(errno_message("ppoll on TCP sockets", errno));
  if (fds.back().revents & POLLIN) interrupt_.clear();
  for (std::size_t i = 0; ready > 0 && i < fds.size(); ++i)
    if (fds[i].events == POLLRDHUP && (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)))
      owners[i]->hung_up = true;  // reported when something is next expected from it
}

// A socket of `peer`'s that hung up: seen by wait_io while idle, or now.
std::string TcpTransport::gone(int peer) {
  for (auto& stream : streams_.at(static_cast<std::size_t>(peer))) {
    if (stream.fd < 0) continue;
    pollfd pfd{stream.fd, POLLRDHUP, 0};
    if (stream.hung_up || (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR))))
      return "its TCP connections to this rank closed: it exited, was killed, or closed its communicator";
  }
  return {};
}

// The rest of a farewell whose header was read (with `why`, the start of
// its reason, read with it): waits up to a second for it, then throws it.
void TcpTransport::throw_farewell(const Stream& stream, const WireHeader& header, std::string why) {
  const std::size_t want = std::min<std::size_t>(header.payload_bytes, kFarewellBytes);
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  while (why.size() < want && Clock::now() < deadline) {
    char buffer[kFarewellBytes];
    iovec iov{buffer, want - why.size()};
    IoResult io = read_some(stream.fd, &iov, 1);
    if (io.closed || io.error) break;
    why.append(buffer, io.bytes);
    if (io.bytes == 0) {
      pollfd ready{stream.fd, POLLIN, 0};
      ::poll(&ready, 1, 100);
    }
  }
  throw farewell_error(stream.peer, rank_, why);
}

void TcpTransport::throw_farewell_if_any(int peer) {
  for (const Stream& stream : streams_.at(static_cast<std::size_t>(peer))) {
    if (stream.fd < 0) continue;
    if (!stream.recvs.empty() && requests_[stream.recvs.front()].moved > 0) continue;  // not at a boundary
    WireHeader header;
    if (::recv(stream.fd, &header, kHeaderBytes, MSG_PEEK | MSG_DONTWAIT) != static_cast<ssize_t>(kHeaderBytes) ||
        header.magic != kFarewellMagic)
      continue;
    (void)::recv(stream.fd, &header, kHeaderBytes, MSG_DONTWAIT);
    throw_farewell(stream, header, {});
  }
}

// A peer's farewell, when one waits, says more than the closed connection.
// An orderly close (end of stream, no error) is also what a peer that only
// destroyed its communicator sends, and it was called "exited, crashed or
// aborted" while it ran on (found by a review helper); a reset is not.
void TcpTransport::fail(const Stream& stream, const char* doing, int error) {
  throw_farewell_if_any(stream.peer);
  std::string peer = "rank " + std::to_string(stream.peer);
  std::string cause = error ? std::string(std::strerror(error)) : "connection closed";
  throw RemoteError("rank " + std::to_string(rank_) + " lost its TCP connection " + doing + " " + peer +
                        " (" + cause + "): " + peer +
                        (error ? " exited, crashed or aborted" : " closed its communicator, or exited, crashed or aborted"),
                    stream.peer);
}

}  // namespace braid::comm::tcp
