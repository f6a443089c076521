// Connection set-up of the TCP transport, on Boost.Asio.
//
// Every rank listens on BRAID_BIND_ADDR with a kernel-chosen port and
// publishes "host:port" under <prefix>/tcp/<rank>. Rank r connects
// BRAID_TCP_NSOCKS sockets to every lower rank and accepts that many from
// every higher rank, so each pair is connected exactly once per socket index.
// The connecting side opens with a Hello:
//   u32 magic "BRDT", u16 version, u16 socket index, i32 from, i32 to,
//   u32 communicator id, u32 token bytes, u16 sockets per peer, u16 0, token
// and the accepting side answers one byte, 0 for accepted. A Hello with the
// wrong magic, version, token, communicator or ranks is refused (1), logged
// and closed, and the acceptor keeps waiting for the right peers; one from
// a peer told another BRAID_TCP_NSOCKS is refused (2) and fails both ranks
// at once, naming the setting (one side waited out the timeout, the other
// blamed the job token). Everything is bounded by the timeout.
//
// Strangers on the listening port cannot starve the real peers (as the
// store's admission does, store_server.h): a connection has
// kHandshakeWithin to send its Hello; at most kMaxStrangers more than the
// connections this rank expects from its peers wait for theirs, and one
// more, or accept() running out of file descriptors, drops the oldest; any
// other accept error is retried after kAcceptRetry. (The first EMFILE ended
// the accept loop: the real peer's connection then sat in the backlog until
// the timeout, blamed on the job token. A flat cap of 64 dropped the job's
// own ranks: 24 ranks of 4 sockets each connect to rank 0 at once, and
// their Hellos follow only once their processes get a core; helper-133's
// F1.) A slot is taken when its Hello is accepted, so two Hellos for one
// rank and socket cannot both be. A connecting rank whose connection is
// closed before the answer (dropped) connects again after kReconnectAfter,
// until the timeout; only an answer that refuses it fails it at once.
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <boost/asio.hpp>
#include <algorithm>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "comm/transport/tcp/transport.h"
#include "runtime/errors.h"
#include "runtime/store.h"

namespace braid::comm::tcp {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr std::uint32_t kHelloMagic = 0x54445242;  // "BRDT"
constexpr std::uint16_t kHelloVersion = 2;
constexpr std::uint8_t kAccepted = 0, kRefused = 1, kOtherSockets = 2;
constexpr std::uint32_t kMaxTokenBytes = 4096;
constexpr std::chrono::milliseconds kCheckEvery{250};
constexpr std::chrono::milliseconds kHandshakeWithin{10000};
constexpr std::chrono::milliseconds kAcceptRetry{50};
constexpr std::size_t kMaxStrangers = 64;
constexpr std::chrono::milliseconds kReconnectAfter{100};
constexpr int kTaken = -2;  // fds[peer][socket] of a Hello accepted, its answer not yet sent

struct Hello {
  std::uint32_t magic = kHelloMagic;
  std::uint16_t version = kHelloVersion;
  std::uint16_t socket_index = 0;
  std::int32_t from = 0;
  std::int32_t to = 0;
  std::uint32_t comm_id = 0;
  std::uint32_t token_bytes = 0;
  std::uint16_t nsocks = 0;
  std::uint16_t reserved = 0;
};

std::string other_sockets(int rank, int theirs, int peer, int mine) {
  return "BRAID_TCP_NSOCKS differs between ranks: rank " + std::to_string(rank) + " connects " +
         std::to_string(theirs) + " socket(s) to each peer, rank " + std::to_string(peer) + " " +
         std::to_string(mine) + "; set it alike on every rank";
}

struct Incoming;

struct Mesh {
  const TcpOptions& options;
  // Above io: the Incoming its destructor frees leave this list.
  std::list<std::weak_ptr<Incoming>> handshaking;  // oldest first
  std::size_t dropped = 0, refused = 0;
  bool accept_warned = false;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  // An io_context that runs out of handlers stops, and then runs none of
  // those started later until restarted. A rank that accepts from no one
  // (the highest) had none while it waited for a lower peer's address: its
  // poll() between the slices stopped the loop, the connections it then
  // started never wrote their Hellos, and it spun until BRAID_TIMEOUT
  // (helper-131's F1). Held for the whole set-up: the loop always has work.
  asio::executor_work_guard<asio::io_context::executor_type> keep_running = asio::make_work_guard(io);
  std::vector<std::vector<int>> fds;
  int pending = 0;
  std::exception_ptr error;
  Clock::time_point deadline = Clock::now() + options.timeout;
  std::size_t max_handshaking = 0;  // the peers' connections and kMaxStrangers more

  explicit Mesh(const TcpOptions& o) : options(o), fds(static_cast<std::size_t>(o.size)) {
    for (int peer = 0; peer < o.size; ++peer)
      if (wanted(peer)) {
        fds[peer].assign(static_cast<std::size_t>(o.nsocks), -1);
        pending += o.nsocks;
      }
    max_handshaking = static_cast<std::size_t>(expected_accepts()) + kMaxStrangers;
  }

  bool wanted(int peer) const {
    return peer != options.rank && (options.peers.empty() || options.peers[peer]);
  }

  int expected_accepts() const {
    int count = 0;
    for (int peer = options.rank + 1; peer < options.size; ++peer) count += wanted(peer) ? options.nsocks : 0;
    return count;
  }

  void adopt(int peer, int index, tcp::socket& socket) {
    fds[peer][index] = socket.release();
    --pending;
  }

  void drop_oldest();
};

// One incoming connection: read and check the Hello, answer, hand over the socket.
struct Incoming : std::enable_shared_from_this<Incoming> {
  Mesh& mesh;
  tcp::socket socket;
  asio::steady_timer deadline;
  std::optional<std::list<std::weak_ptr<Incoming>>::iterator> waiting;  // in mesh.handshaking
  Hello hello;
  std::string token;
  std::uint8_t verdict = kRefused;
  bool dropped = false;

  Incoming(Mesh& m, tcp::socket s) : mesh(m), socket(std::move(s)), deadline(mesh.io) {}
  ~Incoming() { done_waiting(); }

  void start() {
    auto self = shared_from_this();
    waiting = mesh.handshaking.insert(mesh.handshaking.end(), self);
    deadline.expires_after(std::min<std::chrono::milliseconds>(kHandshakeWithin, mesh.options.timeout));
    deadline.async_wait([self](auto ec) {
      if (!ec && self->waiting) self->drop();
    });
    asio::async_read(socket, asio::buffer(&hello, sizeof hello), [self](auto ec, std::size_t) {
      if (ec) return self->refuse("the connection closed during the handshake");
      if (self->hello.magic != kHelloMagic) return self->refuse("it is not a braid peer (bad magic)");
      if (self->hello.token_bytes > kMaxTokenBytes) return self->refuse("its token is oversized");
      self->token.resize(self->hello.token_bytes);
      asio::async_read(self->socket, asio::buffer(self->token), [self](auto ec2, std::size_t) {
        if (ec2) return self->refuse("the connection closed during the handshake");
        self->done_waiting();
        self->check();
      });
    });
  }

  void done_waiting() {
    if (!waiting) return;
    mesh.handshaking.erase(*waiting);
    waiting.reset();
    boost::system::error_code ignored;
    deadline.cancel(ignored);
  }

  // Silent or slow: closed without an answer (its reads end, with it).
  void drop() {
    done_waiting();
    dropped = true;
    ++mesh.dropped;
    boost::system::error_code ignored;
    socket.close(ignored);
  }

  void check() {
    const TcpOptions& o = mesh.options;
    const Hello& h = hello;
    if (h.version != kHelloVersion) return refuse("it speaks protocol version " + std::to_string(h.version));
    if (token != o.job_token) return refuse("it presented the wrong job token");
    if (h.comm_id != o.comm_id || h.to != o.rank) return refuse("it addressed another communicator or rank");
    if (h.nsocks != o.nsocks) {
      // Before the socket index is checked against ours; answered before
      // this rank fails, so that the peer names the cause too.
      verdict = kOtherSockets;
      auto self = shared_from_this();
      const std::string why = other_sockets(h.from, h.nsocks, o.rank, o.nsocks);
      return asio::async_write(socket, asio::buffer(&verdict, 1), [self, why](auto, std::size_t) {
        if (!self->mesh.error) self->mesh.error = std::make_exception_ptr(InvalidUsage(why));
      });
    }
    if (h.from <= o.rank || h.from >= o.size || !mesh.wanted(h.from) || h.socket_index >= o.nsocks)
      return refuse("it claimed to be rank " + std::to_string(h.from) + " socket " +
                    std::to_string(h.socket_index));
    int& slot = mesh.fds[h.from][h.socket_index];
    if (slot != -1) return refuse("its rank and socket are already connected");
    slot = kTaken;
    verdict = kAccepted;
    auto self = shared_from_this();
    asio::async_write(socket, asio::buffer(&verdict, 1), [self](auto ec, std::size_t) {
      if (ec) {  // free again for the peer's next try
        self->mesh.fds[self->hello.from][self->hello.socket_index] = -1;
        return;
      }
      self->mesh.adopt(self->hello.from, self->hello.socket_index, self->socket);
    });
  }

  // The first few refusals are logged each; the rest are counted, and
  // summed up when set-up ends (a flood costs a line).
  void refuse(const std::string& why) {
    if (dropped) return;  // its reads ended because it was
    done_waiting();
    if (++mesh.refused <= 3) {
      boost::system::error_code ec;
      auto remote = socket.remote_endpoint(ec);
      spdlog::warn("rank {} refused a TCP connection from {}: {}{}", mesh.options.rank,
                   ec ? std::string("an unknown address") : remote.address().to_string(), why,
                   mesh.refused == 3 ? "; further refusals are counted, not logged" : "");
    }
    auto self = shared_from_this();
    asio::async_write(socket, asio::buffer(&verdict, 1), [self](auto, std::size_t) {});
  }
};

void Mesh::drop_oldest() {
  if (auto oldest = handshaking.front().lock()) oldest->drop();
  else handshaking.pop_front();
}

bool out_of_descriptors(const boost::system::error_code& ec) {
  return ec == asio::error::no_descriptors || ec == boost::system::errc::too_many_files_open_in_system;
}

void accept_next(Mesh& mesh) {
  mesh.acceptor.async_accept([&mesh](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || mesh.pending <= 0) return;
    if (ec && out_of_descriptors(ec) && !mesh.handshaking.empty()) {
      mesh.drop_oldest();  // frees a descriptor: accept again at once
      return accept_next(mesh);
    }
    if (ec) {
      if (!std::exchange(mesh.accept_warned, true))
        spdlog::warn("rank {} could not accept a TCP connection: {}{}; retrying", mesh.options.rank, ec.message(),
                     out_of_descriptors(ec) ? " (raise the file-descriptor limit, ulimit -n)" : "");
      mesh.accept_retry.expires_after(kAcceptRetry);
      return mesh.accept_retry.async_wait([&mesh](auto wait_ec) {
        if (!wait_ec) accept_next(mesh);
      });
    }
    if (mesh.handshaking.size() >= mesh.max_handshaking) mesh.drop_oldest();
    std::make_shared<Incoming>(mesh, std::move(socket))->start();
    accept_next(mesh);
  });
}

// One outgoing connection to a lower rank: connect, send the Hello, read
// the verdict; where the peer closes it before answering, again.
struct Outgoing : std::enable_shared_from_this<Outgoing> {
  Mesh& mesh;
  int peer, index;
  tcp::endpoint endpoint;
  tcp::socket socket;
  asio::steady_timer reconnect;
  std::vector<std::uint8_t> hello;
  std::uint8_t verdict = kRefused;
  int dropped = 0;

  Outgoing(Mesh& m, int p, int i) : mesh(m), peer(p), index(i), socket(m.io), reconnect(m.io) {}

  void start(const tcp::endpoint& to) {
    endpoint = to;
    const TcpOptions& o = mesh.options;
    Hello h;
    h.socket_index = static_cast<std::uint16_t>(index);
    h.from = o.rank;
    h.to = peer;
    h.comm_id = o.comm_id;
    h.token_bytes = static_cast<std::uint32_t>(o.job_token.size());
    h.nsocks = static_cast<std::uint16_t>(o.nsocks);
    hello.resize(sizeof h + o.job_token.size());
    std::memcpy(hello.data(), &h, sizeof h);
    std::memcpy(hello.data() + sizeof h, o.job_token.data(), o.job_token.size());
    connect();
  }

  void connect() {
    auto self = shared_from_this();
    socket.async_connect(endpoint, [self](auto ec) {
      if (ec) return self->fail("could not connect to " + self->endpoint.address().to_string() + ":" +
                                std::to_string(self->endpoint.port()) + " (" + ec.message() + ")");
      asio::async_write(self->socket, asio::buffer(self->hello), [self](auto ec2, std::size_t) {
        if (ec2) return self->again();
        asio::async_read(self->socket, asio::buffer(&self->verdict, 1), [self](auto ec3, std::size_t) {
          if (ec3) return self->again();
          if (self->verdict == kOtherSockets)
            return self->fail_setting("rank " + std::to_string(self->peer) + " accepts another number of sockets "
                                      "per peer than this rank's BRAID_TCP_NSOCKS=" +
                                      std::to_string(self->mesh.options.nsocks) + "; set it alike on every rank");
          if (self->verdict != kAccepted)
            return self->fail("it refused the handshake (different job token or communicator?)");
          self->mesh.adopt(self->peer, self->index, self->socket);
        });
      });
    });
  }

  // Closed before an answer: the peer dropped it (its listener had more
  // connections waiting for their Hellos than it keeps, or this Hello came
  // past kHandshakeWithin). A peer that has gone refuses the next connect.
  void again() {
    ++dropped;
    boost::system::error_code ignored;
    socket.close(ignored);
    if (mesh.error) return;
    if (Clock::now() + kReconnectAfter >= mesh.deadline)
      return fail("it closed the connection before answering the Hello, " + std::to_string(dropped) +
                  " time(s) (too slow to read it, or its port flooded by other connections)");
    spdlog::debug("rank {}: rank {} closed TCP connection {} before answering its Hello; connecting again",
                  mesh.options.rank, peer, index);
    auto self = shared_from_this();
    reconnect.expires_after(kReconnectAfter);
    reconnect.async_wait([self](auto ec) {
      if (ec || self->mesh.error) return;
      self->socket = tcp::socket(self->mesh.io);
      self->connect();
    });
  }

  void fail_setting(const std::string& why) {
    if (!mesh.error) mesh.error = std::make_exception_ptr(InvalidUsage(why));
  }

  void fail(const std::string& why) {
    if (!mesh.error)
      mesh.error = std::make_exception_ptr(RemoteError(
          "rank " + std::to_string(mesh.options.rank) + " could not set up TCP with rank " +
          std::to_string(peer) + ": " + why));
  }
};

tcp::endpoint parse_endpoint(const std::string& text, int peer) {
  auto colon = text.rfind(':');
  boost::system::error_code ec;
  auto address = asio::ip::make_address(text.substr(0, colon), ec);
  if (colon == std::string::npos || ec)
    throw RemoteError("rank " + std::to_string(peer) + " published an invalid address '" + text + "'");
  return {address, static_cast<std::uint16_t>(std::stoi(text.substr(colon + 1)))};
}

std::string missing_peers(const Mesh& mesh) {
  std::string list;
  for (std::size_t peer = 0; peer < mesh.fds.size(); ++peer)
    for (int fd : mesh.fds[peer])
      if (fd < 0) {
        list += (list.empty() ? "" : ", ") + std::to_string(peer);
        break;
      }
  return list;
}

// Connects the sockets; returns fds[peer][socket], empty for this rank and
// for ranks not connected.
std::vector<std::vector<int>> connect_mesh(runtime::Store& store, const std::string& key_prefix,
                                           const TcpOptions& o) {
  Mesh mesh(o);
  if (mesh.pending == 0) return mesh.fds;
  boost::system::error_code ec;
  auto bind_address = asio::ip::make_address(o.bind_addr, ec);
  if (ec) throw InvalidUsage("BRAID_BIND_ADDR='" + o.bind_addr + "' is not an IP address");
  mesh.acceptor.open(bind_address.is_v6() ? tcp::v6() : tcp::v4());
  // An address of another machine failed as "bind: Cannot assign requested
  // address", naming neither the address nor where it came from.
  if (mesh.acceptor.bind({bind_address, 0}, ec))
    throw SystemError("rank " + std::to_string(o.rank) + " cannot listen for TCP peers on " + o.bind_addr +
                      " (BRAID_BIND_ADDR, or the address braid-launch chose): " + ec.message() +
                      (ec == boost::system::errc::address_not_available ? "; it is not an address of this machine"
                                                                         : ""));
  mesh.acceptor.listen(asio::socket_base::max_listen_connections);
  auto local = mesh.acceptor.local_endpoint();
  const std::string advertised = o.advertise_addr.empty() ? local.address().to_string() : o.advertise_addr;
  store.set(key_prefix + "/tcp/" + std::to_string(o.rank), advertised + ":" + std::to_string(local.port()));
  if (mesh.expected_accepts() > 0) accept_next(mesh);
  // Every wait runs in slices, between which a failure that a peer or its
  // launcher published ends it (o.check_peers): a rank whose set-up failed
  // early (its address, its descriptors) was waited for until the timeout,
  // and the last rank to give up blamed the job token.
  const auto deadline = mesh.deadline;
  auto next_check = Clock::now() + kCheckEvery;
  auto check = [&] {
    if (!o.check_peers || Clock::now() < next_check) return;
    next_check = Clock::now() + kCheckEvery;
    o.check_peers(deadline);
  };
  try {
    for (int peer = 0; peer < o.rank; ++peer) {
      if (!mesh.wanted(peer)) continue;
      const std::string key = key_prefix + "/tcp/" + std::to_string(peer);
      std::optional<std::string> address;
      while (!address) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
        try {
          address = store.get_string(key, std::clamp(left, std::chrono::milliseconds(1), kCheckEvery));
        } catch (const TimeoutError&) {
          if (left <= kCheckEvery)  // the whole wait's figure, not the last slice's
            throw TimeoutError("rank " + std::to_string(o.rank) + " waited " + std::to_string(o.timeout.count()) +
                               " ms (BRAID_TIMEOUT) for rank " + std::to_string(peer) +
                               " to publish its TCP address (key '" + key + "' in the store): it may have failed, "
                               "not started, or be stopped");
          mesh.io.poll();  // the higher ranks' handshakes meanwhile
          check();
        }
      }
      auto endpoint = parse_endpoint(*address, peer);
      for (int index = 0; index < o.nsocks; ++index)
        std::make_shared<Outgoing>(mesh, peer, index)->start(endpoint);
    }
    while (mesh.pending > 0 && !mesh.error && Clock::now() < deadline) {
      mesh.io.run_one_until(std::min(deadline, Clock::now() + kCheckEvery));
      check();
    }
  } catch (...) {
    if (!mesh.error) mesh.error = std::current_exception();
  }
  mesh.acceptor.close();
  if (mesh.dropped || mesh.refused > 3)
    spdlog::warn("rank {} refused {} and dropped {} TCP connection(s) during set-up (dropped: no Hello within {} ms, "
                 "or past {} waiting for theirs; a peer's dropped connection connects again); something other than "
                 "the job's ranks may be connecting to its port",
                 o.rank, mesh.refused, mesh.dropped,
                 std::min<std::chrono::milliseconds>(kHandshakeWithin, o.timeout).count(), mesh.max_handshaking);
  if (!mesh.error && mesh.pending > 0)
    mesh.error = std::make_exception_ptr(TimeoutError(
        "rank " + std::to_string(o.rank) + " timed out setting up TCP connections: rank(s) " +
        missing_peers(mesh) + " never connected; are they running with the same job token?"));
  if (mesh.error) {
    // A peer that refused or reset this rank's connection has, as a rule,
    // published why (another BRAID_TCP_NSOCKS, say) a moment before or
    // after: that is the cause to report, not "Connection reset by peer".
    std::exception_ptr error = mesh.error;
    bool refused = false, timed_out = false;
    try {
      std::rethrow_exception(error);
    } catch (const RemoteError&) {
      refused = true;
    } catch (const TimeoutError&) {
      timed_out = true;
    } catch (...) {
    }
    if (refused && o.check_peers) {
      const auto until = Clock::now() + std::chrono::seconds(1);
      try {
        for (;;) {
          o.check_peers(until);  // throws the published cause
          if (Clock::now() >= until) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      } catch (...) {
        error = std::current_exception();
      }
    }
    // Peers that finished their set-up with this rank ask why as they see
    // its sockets close: the reason goes first (helper-133's F2). A timeout
    // is not published here: its peers, timing out too, would each blame it.
    if (o.announce_failure && !timed_out) {
      try {
        std::rethrow_exception(error);
      } catch (const Error& e) {  // others get set-up's wording (fail_setup), which it publishes
        o.announce_failure(e.what());
      } catch (...) {
      }
    }
    for (auto& peer_fds : mesh.fds)
      for (int fd : peer_fds)
        if (fd >= 0) ::close(fd);
    std::rethrow_exception(error);
  }
  return mesh.fds;
}

}  // namespace

std::unique_ptr<TcpTransport> connect_tcp(runtime::Store& store, const std::string& key_prefix,
                                          const TcpOptions& options) {
  const std::vector<std::vector<int>> fds = connect_mesh(store, key_prefix, options);
  // The transport owns the sockets once made; a constructor that throws (a
  // socket option refused, no descriptor left for its eventfd while another
  // thread took the last) left them open, and its peers waiting on them
  // (helper-133's F3). Closed here, after the reason is published.
  auto close_all = [&] {
    for (const auto& peer_fds : fds)
      for (int fd : peer_fds)
        if (fd >= 0) ::close(fd);
  };
  try {
    return std::make_unique<TcpTransport>(options.rank, fds, options.buffer_bytes, options.spin);
  } catch (const Error& e) {
    if (options.announce_failure) options.announce_failure(e.what());
    close_all();
    throw;
  } catch (...) {
    close_all();
    throw;
  }
}

}  // namespace braid::comm::tcp
