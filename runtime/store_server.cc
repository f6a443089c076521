// The store's server side: one thread runs one io_context; every connection
// is a Session driven by asynchronous reads and writes, so a slow or silent
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

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including
// <utility>; GCC 12 in C++20 mode needs it included first.
#include <utility>

#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "runtime/errors.h"
#include "runtime/store.h"
#include "runtime/store_wire.h"

namespace braid::runtime {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using namespace store_wire;

// Time a refused client gets to read our answer and hang up before we close.
constexpr std::chrono::seconds kLingerTime{1};

// The keys and values, and what each command does to them; no I/O.
class KeyValueMap {
 public:
  void set(const std::string& key, Bytes value) { values_[key] = std::move(value); }

  const Bytes* find(const std::string& key) const {
    auto it = values_.find(key);
    return it == values_.end() ? nullptr : &it->second;
  }

  bool remove(const std::string& key) { return values_.erase(key) > 0; }

  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& key : keys)
      if (!values_.count(key)) out.push_back(key);
    return out;
  }

  // Counters are decimal text (store_wire.h); throws InvalidUsage when the
  // key holds something else or the sum would overflow.
  std::int64_t add(const std::string& key, std::int64_t delta) {
    std::int64_t value = 0;
    if (const Bytes* old = find(key)) value = parse_counter(key, *old);
    if (__builtin_add_overflow(value, delta, &value))
      throw InvalidUsage("store add on key '" + key + "' would overflow a 64-bit counter");
    std::string text = std::to_string(value);
    values_[key] = Bytes(text.begin(), text.end());
    return value;
  }

 private:
  static std::int64_t parse_counter(const std::string& key, const Bytes& bytes) {
    const char* first = reinterpret_cast<const char*>(bytes.data());
    const char* last = first + bytes.size();
    std::int64_t value = 0;
    auto [end, err] = std::from_chars(first, last, value);
    if (err != std::errc() || end != last || bytes.empty())
      throw InvalidUsage("store add on key '" + key +
                         "': its value is not a decimal integer; use a separate key as a counter");
    return value;
  }

  std::unordered_map<std::string, Bytes> values_;
};

class Session;

// Everything the server owns. io_ comes first so that it is destroyed last:
// its destructor destroys the pending handlers that keep Sessions alive, and
// their sockets and timers must go while it still exists.
class ServerCore {
 public:
  ServerCore(const std::string& bind_addr, std::uint16_t port, std::string token);
  ~ServerCore();

  std::uint16_t port() const { return port_; }
  const std::string& token() const { return token_; }
  KeyValueMap& map() { return map_; }

  void park(const std::shared_ptr<Session>& session) { parked_.insert(session); }
  void unpark(const std::shared_ptr<Session>& session) { parked_.erase(session); }
  // A key appeared: answer every parked Session whose keys are now present.
  void key_added();

 private:
  void open(const std::string& bind_addr, std::uint16_t port);
  void accept();
  void serve();

  asio::io_context io_{1};
  tcp::acceptor acceptor_{io_};
  asio::steady_timer accept_retry_{io_};
  std::string token_;
  std::uint16_t port_ = 0;
  KeyValueMap map_;
  std::unordered_set<std::shared_ptr<Session>> parked_;
  std::thread thread_;
};

// One client connection (see the top of this file).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, ServerCore& server);
  void start() { read_handshake(); }
  void resume_if_ready();

 private:
  struct Parked {
    Command command;
    std::vector<std::string> keys;
  };
  using Next = void (Session::*)();

  void read_handshake();
  void on_handshake_header();
  void on_token();
  void refuse_handshake(const std::string& why);

  void read_request();
  void on_request_header();
  void on_request_body();
  void dispatch(Command command, WireReader& in);
  void handle_set(WireReader& in);
  void handle_try_get(WireReader& in);
  void handle_add(WireReader& in);
  void handle_remove(WireReader& in);

  void wait_for_keys(Command command, std::vector<std::string> keys, std::chrono::milliseconds timeout);
  void watch_for_hangup();
  void finish_wait(bool timed_out);

  void respond(Status status, const Bytes& body);
  void reject(const std::string& why);
  void send(Bytes bytes, Next next);
  void linger_close();
  void drain();

  tcp::socket socket_;
  ServerCore& server_;
  std::string remote_;
  asio::steady_timer timer_;
  std::array<std::uint8_t, kHandshakeHeaderBytes> header_{};
  std::array<std::uint8_t, 4096> scratch_{};
  Bytes body_;
  Bytes out_;
  std::optional<Parked> parked_;
  // Counts requests, so a timer or hang-up handler that fires after its
  // request was answered recognises that it is stale.
  std::uint64_t request_seq_ = 0;
};

std::string endpoint_text(const tcp::socket& socket) {
  error_code ec;
  auto endpoint = socket.remote_endpoint(ec);
  return ec ? std::string("an unknown peer")
            : endpoint.address().to_string() + ":" + std::to_string(endpoint.port());
}

Bytes text_bytes(const std::string& text) { return Bytes(text.begin(), text.end()); }

// ---- Session: handshake --------------------------------------------------

Session::Session(tcp::socket socket, ServerCore& server)
    : socket_(std::move(socket)), server_(server), remote_(endpoint_text(socket_)),
      timer_(socket_.get_executor()) {}

void Session::read_handshake() {
  asio::async_read(socket_, asio::buffer(header_, kHandshakeHeaderBytes),
                   [self = shared_from_this()](error_code ec, std::size_t) {
                     if (!ec) self->on_handshake_header();
                   });
}

void Session::on_handshake_header() {
  std::uint32_t version = load_u32(header_.data() + 4);
  std::uint32_t token_bytes = load_u32(header_.data() + 8);
  if (std::memcmp(header_.data(), kMagic, sizeof kMagic) != 0)
    return refuse_handshake("not a braid store client (bad magic)");
  if (version != kStoreProtocolVersion)
    return refuse_handshake("protocol version " + std::to_string(version) + ", this store speaks " +
                            std::to_string(kStoreProtocolVersion) + "; mixed braid versions in one job?");
  if (token_bytes > kMaxTokenBytes)
    return refuse_handshake("job token of " + std::to_string(token_bytes) + " bytes is too long");
  body_.resize(token_bytes);
  asio::async_read(socket_, asio::buffer(body_), [self = shared_from_this()](error_code ec, std::size_t) {
    if (!ec) self->on_token();
  });
}

void Session::on_token() {
  const std::string& token = server_.token();
  if (!std::equal(body_.begin(), body_.end(), token.begin(), token.end()))
    return refuse_handshake(
        "wrong job token; the client belongs to another job, or BRAID_JOB_TOKEN differs between ranks");
  spdlog::debug("store: accepted connection from {}", remote_);
  Bytes reply{0};
  put_u32(reply, 0);
  send(std::move(reply), &Session::read_request);
}

void Session::refuse_handshake(const std::string& why) {
  spdlog::warn("store refused connection from {}: {}", remote_, why);
  std::string message = "store refused connection: " + why;
  Bytes reply{1};
  put_u32(reply, static_cast<std::uint32_t>(message.size()));
  put_text(reply, message);
  send(std::move(reply), &Session::linger_close);
}

// ---- Session: requests ---------------------------------------------------

void Session::read_request() {
  asio::async_read(socket_, asio::buffer(header_, kFrameHeaderBytes),
                   [self = shared_from_this()](error_code ec, std::size_t) {
                     if (!ec) self->on_request_header();
                   });
}

void Session::on_request_header() {
  std::uint32_t body_bytes = load_u32(header_.data());
  if (body_bytes > kMaxRequestBytes)
    return reject("request of " + std::to_string(body_bytes) + " bytes exceeds the store's limit of " +
                  std::to_string(kMaxRequestBytes) + " bytes");
  body_.resize(body_bytes);
  asio::async_read(socket_, asio::buffer(body_), [self = shared_from_this()](error_code ec, std::size_t) {
    if (!ec) self->on_request_body();
  });
}

void Session::on_request_body() {
  ++request_seq_;
  WireReader in(body_);
  try {
    dispatch(static_cast<Command>(header_[4]), in);
  } catch (const RemoteError& e) {
    reject(e.what());
  } catch (const InvalidUsage& e) {
    respond(Status::bad_value, text_bytes(e.what()));
  }
}

void Session::dispatch(Command command, WireReader& in) {
  switch (command) {
    case Command::set: return handle_set(in);
    case Command::try_get: return handle_try_get(in);
    case Command::add: return handle_add(in);
    case Command::remove: return handle_remove(in);
    case Command::get: {
      auto timeout = std::chrono::milliseconds(in.u32());
      std::string key = in.key();
      in.expect_end();
      return wait_for_keys(command, {std::move(key)}, timeout);
    }
    case Command::wait: {
      auto timeout = std::chrono::milliseconds(in.u32());
      auto keys = in.keys();
      in.expect_end();
      return wait_for_keys(command, std::move(keys), timeout);
    }
  }
  throw RemoteError("unknown store command " + std::to_string(header_[4]));
}

void Session::handle_set(WireReader& in) {
  std::string key = in.key();
  server_.map().set(key, in.rest());
  respond(Status::ok, {});
  server_.key_added();
}

void Session::handle_try_get(WireReader& in) {
  std::string key = in.key();
  in.expect_end();
  const Bytes* value = server_.map().find(key);
  respond(value ? Status::ok : Status::not_found, value ? *value : Bytes{});
}

void Session::handle_add(WireReader& in) {
  std::int64_t delta = in.i64();
  std::string key = in.key();
  in.expect_end();
  Bytes reply;
  put_i64(reply, server_.map().add(key, delta));
  respond(Status::ok, reply);
  server_.key_added();
}

void Session::handle_remove(WireReader& in) {
  std::string key = in.key();
  in.expect_end();
  respond(Status::ok, Bytes{server_.map().remove(key)});
}

// ---- Session: parked get and wait ----------------------------------------

void Session::wait_for_keys(Command command, std::vector<std::string> keys,
                            std::chrono::milliseconds timeout) {
  parked_ = Parked{command, std::move(keys)};
  if (server_.map().missing(parked_->keys).empty()) return finish_wait(false);
  server_.park(shared_from_this());
  timer_.expires_after(timeout);
  timer_.async_wait([self = shared_from_this(), seq = request_seq_](error_code ec) {
    if (!ec && self->parked_ && self->request_seq_ == seq) self->finish_wait(true);
  });
  watch_for_hangup();
}

void Session::resume_if_ready() {
  if (parked_ && server_.map().missing(parked_->keys).empty()) finish_wait(false);
}

// The client sends nothing while it waits, so the socket turning readable
// means it hung up (or broke the protocol): either way, stop waiting for it.
void Session::watch_for_hangup() {
  socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this(), seq = request_seq_](error_code ec) {
    if (ec == asio::error::operation_aborted || !self->parked_ || self->request_seq_ != seq) return;
    spdlog::debug("store: client {} hung up while waiting for keys {}", self->remote_,
                  join_keys(self->parked_->keys));
    self->server_.unpark(self);
    self->parked_.reset();
    self->timer_.cancel();
    self->socket_.close(ec);
  });
}

void Session::finish_wait(bool timed_out) {
  Parked parked = std::move(*parked_);
  parked_.reset();
  server_.unpark(shared_from_this());
  error_code ignored;
  timer_.cancel();
  socket_.cancel(ignored);  // the hang-up watch
  if (timed_out) {
    Bytes missing;
    put_keys(missing, server_.map().missing(parked.keys));
    return respond(Status::timeout, missing);
  }
  const Bytes* value = parked.command == Command::get ? server_.map().find(parked.keys[0]) : nullptr;
  respond(Status::ok, value ? *value : Bytes{});
}

// ---- Session: writing and closing ----------------------------------------

void Session::respond(Status status, const Bytes& body) {
  send(frame(std::uint8_t(status), body), &Session::read_request);
}

void Session::reject(const std::string& why) {
  spdlog::warn("store closed the connection from {}: {}", remote_, why);
  send(frame(std::uint8_t(Status::bad_request), text_bytes(why)), &Session::linger_close);
}

void Session::send(Bytes bytes, Next next) {
  out_ = std::move(bytes);
  asio::async_write(socket_, asio::buffer(out_),
                    [self = shared_from_this(), next](error_code ec, std::size_t) {
                      if (!ec) (self.get()->*next)();
                    });
}

// Closing at once could reset the connection and destroy our refusal in
// flight (the peer may still be sending); instead send FIN, discard what the
// peer sends until it hangs up, and close after kLingerTime at the latest.
void Session::linger_close() {
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  timer_.expires_after(kLingerTime);
  timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (!ec) self->socket_.close(ec);
  });
  drain();
}

void Session::drain() {
  socket_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](error_code ec, std::size_t) {
    if (!ec) return self->drain();
    self->timer_.cancel();
    self->socket_.close(ec);
  });
}

// ---- ServerCore ----------------------------------------------------------

ServerCore::ServerCore(const std::string& bind_addr, std::uint16_t port, std::string token)
    : token_(std::move(token)) {
  open(bind_addr, port);
  accept();
  thread_ = std::thread([this] { serve(); });
  spdlog::debug("store: serving on {}:{}", bind_addr, port_);
}

// stop() abandons parked waiters and open connections where they stand;
// clearing parked_ and then destroying io_ frees their Sessions, whose
// sockets close and so tell their clients.
ServerCore::~ServerCore() {
  io_.stop();
  thread_.join();
  parked_.clear();
}

void ServerCore::open(const std::string& bind_addr, std::uint16_t port) {
  std::string where = bind_addr + ":" + std::to_string(port);
  error_code ec;
  auto address = asio::ip::make_address(bind_addr, ec);
  if (ec) throw InvalidUsage("store bind address '" + bind_addr + "' is not an IP address");
  tcp::endpoint endpoint(address, port);
  if (acceptor_.open(endpoint.protocol(), ec) ||
      acceptor_.set_option(tcp::acceptor::reuse_address(true), ec) || acceptor_.bind(endpoint, ec) ||
      acceptor_.listen(asio::socket_base::max_listen_connections, ec))
    throw SystemError("store cannot listen on " + where + ": " + ec.message() +
                      (port ? "; is another job using this port?" : ""));
  port_ = acceptor_.local_endpoint().port();
}

void ServerCore::accept() {
  acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      // Typically out of file descriptors: back off rather than spin.
      spdlog::warn("store on port {} could not accept a connection: {}", port_, ec.message());
      accept_retry_.expires_after(std::chrono::milliseconds(50));
      accept_retry_.async_wait([this](error_code wait_ec) {
        if (!wait_ec) accept();
      });
      return;
    }
    socket.set_option(tcp::no_delay(true), ec);
    std::make_shared<Session>(std::move(socket), *this)->start();
    accept();
  });
}

void ServerCore::key_added() {
  std::vector<std::shared_ptr<Session>> parked(parked_.begin(), parked_.end());
  for (const auto& session : parked) session->resume_if_ready();
}

// Handlers do not throw by design; should one do so anyway, log it and keep
// serving rather than let the exception end the process.
void ServerCore::serve() {
  for (;;) {
    try {
      io_.run();
      return;
    } catch (const std::exception& e) {
      spdlog::error("store on port {}: unexpected error in a handler: {}", port_, e.what());
    }
  }
}

}  // namespace

struct StoreServer::Impl : ServerCore {
  using ServerCore::ServerCore;
};

StoreServer::StoreServer(const std::string& bind_addr, std::uint16_t port, std::string token)
    : impl_(std::make_unique<Impl>(bind_addr, port, std::move(token))) {}

StoreServer::~StoreServer() = default;

std::uint16_t StoreServer::port() const { return impl_->port(); }

}  // namespace braid::runtime
