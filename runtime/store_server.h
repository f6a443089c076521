// Private to runtime/: the store's server side, shared by store_server.cc
// (the server and its admission of connections) and store_session.cc (one
// connection). One thread runs one io_context; every connection is a
// Session driven by asynchronous reads and writes, so a slow or silent
// client never holds up another.
//
// A Session reads the handshake, then loops: read a request frame, apply it,
// write the response. A client sends its next request only after the answer
// to the last one, so a Session has at most one request in hand. A get or
// wait whose keys are missing parks the Session: its timer bounds the wait,
// and every set or add asks each parked Session whether its keys are now all
// present. While parked, the Session watches its socket so that a client
// that hangs up stops waiting at once.
//
// Broken peers (wrong magic, version or token; oversized or malformed
// requests) get a refusal and a closed connection, and a warning naming
// their endpoint; the loop serving the others does not notice.
//
// Admission (StoreLimits): until its handshake is complete a Session is
// "pending". Its timer bounds the handshake; the pending Sessions form a
// queue, oldest first, of at most max_pending_handshakes, and accepting one
// more, or accept() running out of file descriptors, drops the oldest. So
// idle or slow connections, however many, hold a bounded number of
// descriptors, and a real client, which sends its handshake as soon as it
// connects, is never the oldest for long. Drops are logged by DropLog, a few
// lines per flood.
//
// Memory: keys and values live in a StoreMap (store_map.h), bounded by
// StoreLimits::max_bytes. Request bodies being received are bounded by a
// budget of the same size, reserved when a request header announces its
// body and released when the request is answered; a body that does not fit
// is read and discarded, and answered with bad_value, so the client gets a
// reason and keeps its connection.
#pragma once

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including
// <utility>; GCC 12 in C++20 mode needs it included first.
#include <utility>

#include <boost/asio.hpp>

#include <array>
#include <chrono>
#include <list>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "runtime/store.h"
#include "runtime/store_map.h"
#include "runtime/store_wire.h"

namespace braid::runtime::store_server {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using store_map::StoreMap;
using store_map::Value;
using store_wire::Command;
using store_wire::Status;
using store_wire::WireReader;

class Session;

// Connections accepted whose handshake is not complete, oldest first.
class PendingHandshakes {
 public:
  using Slot = std::list<Session*>::iterator;
  Slot add(Session* session) { return sessions_.insert(sessions_.end(), session); }
  void remove(Slot slot) { sessions_.erase(slot); }
  Session* oldest() const { return sessions_.empty() ? nullptr : sessions_.front(); }
  std::size_t size() const { return sessions_.size(); }

 private:
  std::list<Session*> sessions_;
};

enum class DropReason { over_cap, no_handshake, no_descriptors };

// Counts the unauthenticated connections the server drops, and those whose
// handshake it refuses, and logs them: the first at once, the rest summed up
// every kDropLogInterval while they keep coming, so a flood of thousands
// (a port scanner, an HTTP client in a loop) costs a few lines.
class DropLog {
 public:
  DropLog(asio::io_context& io, const StoreLimits& limits) : timer_(io), limits_(limits) {}
  void set_port(std::uint16_t port) { port_ = port; }
  void record(DropReason reason, const std::string& remote);
  void refused(const std::string& remote, const std::string& why);

 private:
  void write(bool first);
  void write_refusals();
  void arm();

  asio::steady_timer timer_;
  const StoreLimits& limits_;
  std::uint16_t port_ = 0;
  std::array<std::size_t, 3> counts_{};
  std::string last_remote_;
  std::size_t refusals_ = 0;
  std::string last_refusal_;
  bool armed_ = false;
};

// Everything the server owns. io_ is destroyed after the members declared
// below it: its destructor destroys the pending handlers that keep Sessions
// alive, and their sockets and timers must go while it still exists. The
// members above it outlive it, because a Session's destructor still leaves
// the pending queue and returns its request budget.
class ServerCore {
 public:
  // Listens on the first of `ports` free on bind_addr (StoreServer's
  // constructors describe the choice and its errors).
  ServerCore(const std::string& bind_addr, const std::vector<std::uint16_t>& ports, std::string token,
             const std::string& remedy, const StoreLimits& limits);
  ~ServerCore();

  std::uint16_t port() const { return port_; }
  const std::string& token() const { return token_; }
  // Drawn at random when the store starts (store_wire.h's handshake).
  std::uint64_t instance() const { return instance_; }
  const StoreLimits& limits() const { return limits_; }
  StoreMap& map() { return map_; }
  PendingHandshakes& pending() { return pending_; }
  DropLog& drops() { return drops_; }

  // The request-body budget: false when `bytes` more would exceed it.
  bool reserve_request(std::size_t bytes);
  void release_request(std::size_t bytes) { receiving_bytes_ -= bytes; }

  void park(const std::shared_ptr<Session>& session) { parked_.insert(session); }
  void unpark(const std::shared_ptr<Session>& session) { parked_.erase(session); }
  // A key appeared: answer every parked Session whose keys are now present.
  void key_added();

 private:
  void open(const std::string& bind_addr, const std::vector<std::uint16_t>& ports, const std::string& remedy);
  error_code listen_on(const tcp::endpoint& endpoint);
  void accept();
  void on_accept_error(const error_code& ec);
  void serve();

  StoreLimits limits_;
  PendingHandshakes pending_;
  std::size_t receiving_bytes_ = 0;
  asio::io_context io_{1};
  tcp::acceptor acceptor_{io_};
  asio::steady_timer accept_retry_{io_};
  std::chrono::steady_clock::time_point last_accept_warning_{};
  DropLog drops_{io_, limits_};
  std::string token_;
  std::uint64_t instance_;
  std::uint16_t port_ = 0;
  StoreMap map_;
  std::unordered_set<std::shared_ptr<Session>> parked_;
  std::thread thread_;
};

// One client connection (see the top of this file).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, ServerCore& server);
  ~Session();
  void start();
  void resume_if_ready();
  // Closes a connection that has not completed its handshake.
  void drop(DropReason reason);

 private:
  struct Parked {
    Command command;
    std::vector<std::string> keys;
  };
  using Next = void (Session::*)();

  void read_handshake();
  void on_handshake_header();
  void on_token();
  void refuse_handshake(const std::string& why, std::uint8_t status = store_wire::kHandshakeRefused);
  void leave_pending();

  void read_request();
  void on_request_header();
  void on_request_body();
  void discard_request();
  std::string refusal_of_request() const;
  void release_request();
  void reserve_for_keys(std::uint32_t count);
  void dispatch(Command command, WireReader& in);
  void handle_set(WireReader& in);
  void handle_try_get(WireReader& in);
  void handle_add(WireReader& in);
  void handle_remove(WireReader& in);
  void handle_remove_prefix(WireReader& in);

  void wait_for_keys(Command command, std::vector<std::string> keys, std::chrono::milliseconds timeout);
  void watch_for_hangup();
  void finish_wait(bool timed_out);

  void respond(Status status, const Bytes& body);
  void respond_value(Value value);
  void reject(const std::string& why);
  void send(Bytes bytes, Next next);
  void linger_close();
  void drain();

  tcp::socket socket_;
  ServerCore& server_;
  std::string remote_;
  asio::steady_timer timer_;
  std::optional<PendingHandshakes::Slot> pending_;
  std::array<std::uint8_t, store_wire::kHandshakeHeaderBytes> header_{};
  std::array<std::uint8_t, 4096> scratch_{};
  Bytes body_;
  std::size_t reserved_bytes_ = 0;  // of the server's request budget, for body_
  std::size_t discard_bytes_ = 0;   // of a refused request body still to read
  Bytes out_;
  Value out_value_;  // a stored value being sent after out_
  std::optional<Parked> parked_;
  // Counts requests, so a timer or hang-up handler that fires after its
  // request was answered recognises that it is stale.
  std::uint64_t request_seq_ = 0;
};

}  // namespace braid::runtime::store_server
