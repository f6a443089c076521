// The TCP transport: one or more sockets (BRAID_TCP_NSOCKS) to every peer,
// set up through the store by connect_tcp() (connection.cc), then driven by
// one poll() loop in the thread running the current operation.
//
// Wire format on each socket: a stream of messages, each a WireHeader
// (comm/wire.h) followed by header.payload_bytes of payload. The k-th message
// between two ranks in one direction travels on socket k % nsocks, so both
// sides agree on where each segment goes without any extra signalling, and
// segments of one chunk spread over the sockets.
//
// A rank whose communicator fails tells each peer why before it closes
// (farewell()): a message with kFarewellMagic in place of the header's magic
// and the reason as payload, on every socket where it would not land
// inside a message already begun. The receiver reads it where it expected a
// header, or finds it waiting when its send to that peer fails or another
// socket to it closed mid-message, and names the reason rather than a closed
// connection. Without a launcher the store that carries reasons otherwise
// is rank 0's, so when rank 0 fails this is the only way its reason, or a
// relaying neighbour's, reaches the others.
//
// The data path uses the raw descriptors with readv/sendmsg and ppoll rather
// than Asio's reactor: one thread owns every socket of a communicator while
// an operation runs, so a reactor's locking and handler queues buy nothing,
// and a header plus its payload leave in one vectored call.
#pragma once

#include "comm/transport/transport_only.h"

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport/poll_interrupt.h"
#include "comm/transport/pools.h"
#include "comm/transport/transport.h"

namespace braid::runtime {
class Store;
}

namespace braid::comm::tcp {

struct TcpOptions : ConnectOptions {
  int nsocks = 1;
  std::size_t buffer_bytes = 4u << 20;  // SO_SNDBUF and SO_RCVBUF of every socket
  std::string bind_addr = "127.0.0.1";
  // The address published for peers to connect to; empty: the one bound.
  // A wildcard bind (0.0.0.0, ::) is no address a peer on another host
  // can reach.
  std::string advertise_addr;
  std::vector<bool> peers;  // which ranks to connect; empty means all
};

class TcpTransport;

// Connects this rank to every other rank of the communicator: publishes a
// listening address under `key_prefix` in the store, connects to lower ranks,
// accepts higher ranks. Every connection starts with a handshake carrying the
// job token, protocol version, communicator id and both ranks; a mismatch is
// refused and logged. Only the ranks in options.peers are connected (both
// sides must agree). Returns the transport over those connections.
std::unique_ptr<TcpTransport> connect_tcp(runtime::Store& store, const std::string& key_prefix,
                                          const TcpOptions& options);

class TcpTransport final : public Transport {
 public:
  // `spin`: how long progress() keeps polling the sockets before it sleeps in ppoll.
  TcpTransport(int rank, std::vector<std::vector<int>> fds, std::size_t buffer_bytes,
               std::chrono::nanoseconds spin = {});
  ~TcpTransport() override;

  std::string_view name() const override { return "tcp"; }
  RequestId post_send(int peer, const WireHeader& header, const void* data) override;
  RequestId post_recv(int peer, const WireHeader& expected, void* data, Placement placement) override;
  bool is_done(RequestId request) override;
  std::span<const std::byte> view(RequestId request) override;
  void release(RequestId request) override;
  bool progress(Clock::time_point deadline) override;
  void interrupt() override { interrupt_.raise(); }
  void shutdown() override;
  void farewell(const std::string& reason) override;
  std::string gone(int peer) override;
  std::uint64_t bytes_sent() const override { return bytes_sent_; }
  std::uint64_t bytes_received() const override { return bytes_received_; }

 private:
  struct Request {
    bool done = false;
    int peer = -1;
    WireHeader header;    // sent, or expected
    WireHeader received;  // as it arrived
    std::byte* data = nullptr;
    std::size_t moved = 0;  // header + payload bytes moved so far
    Staging staging;
    std::byte* copy_to = nullptr;  // a small receive into caller memory: staged, copied once checked
  };
  struct Stream {
    int fd = -1;
    int peer = -1;
    bool hung_up = false;  // peer closed while we expected nothing from it
    std::deque<RequestId> sends;
    std::deque<RequestId> recvs;
  };

  RequestId allocate(int peer, const WireHeader& header);
  Stream& stream_for(int peer, std::vector<std::uint64_t>& counter);
  bool pump_sends(Stream& stream);
  bool pump_recvs(Stream& stream);
  void finish_header(Request& request);
  void wait_io(Clock::time_point deadline);
  [[noreturn]] void fail(const Stream& stream, const char* doing, int error);
  [[noreturn]] void throw_farewell(const Stream& stream, const WireHeader& header, std::string why);
  // A farewell waiting at a message boundary of one of `peer`'s sockets:
  // throws it; returns when there is none.
  void throw_farewell_if_any(int peer);

  int rank_;
  std::size_t buffer_bytes_;
  std::chrono::nanoseconds spin_;
  std::vector<std::vector<Stream>> streams_;  // [peer][socket]
  std::vector<std::uint64_t> sent_count_, received_count_;  // messages per peer
  RequestPool<Request> requests_;
  std::vector<pollfd> poll_fds_;       // wait_io's scratch
  PollInterrupt interrupt_;            // wait_io watches it
  std::vector<Stream*> poll_owners_;
  StagingPool staging_;
  std::atomic<std::uint64_t> bytes_sent_{0}, bytes_received_{0};
};

}  // namespace braid::comm::tcp
