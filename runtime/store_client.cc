// The store's client side. Each Store owns a private io_context that only the
// calling thread drives, and only through run_one_until(deadline): every
// connect, write and read is bounded, and a deadline that passes closes the
// socket, which cancels the operation. A request that failed in transport
// leaves the byte stream in an unknown state, so the connection is then
// marked broken and later requests fail at once with the first cause.

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including
// <utility>; GCC 12 in C++20 mode needs it included first.
#include <utility>

#include <boost/asio.hpp>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>

#include "runtime/config.h"
#include "runtime/errors.h"
#include "runtime/store.h"
#include "runtime/store_wire.h"

namespace braid::runtime {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using namespace store_wire;

// Added to a get or wait's own timeout, for the server's answer to arrive.
constexpr milliseconds kAnswerMargin{1000};
constexpr milliseconds kConnectRetry{25};

struct Reply {
  Status status;
  Bytes body;
};

// One exchange with the server: its deadline, and what it was doing, for
// the error message if it fails ("while setting key 'x'").
struct Exchange {
  Exchange(milliseconds bound, std::string doing)
      : timeout(bound), deadline(Clock::now() + bound), what(std::move(doing)) {}
  milliseconds timeout;
  Clock::time_point deadline;
  std::string what;
};

std::uint32_t wire_ms(milliseconds timeout) {
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>(timeout.count(), 0, UINT32_MAX));
}

std::string ms_text(milliseconds duration) { return std::to_string(duration.count()) + " ms"; }

bool is_hang_up(const error_code& ec) {
  return ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::connection_aborted;
}

}  // namespace

struct Store::Impl {
  Impl(std::string host, std::uint16_t port, std::string token, milliseconds connect_timeout);

  // Sends one request and reads its answer, holding the mutex throughout.
  // Bounded by the request timeout, or for a get or wait by its own `wait`
  // plus kAnswerMargin. Returns replies with status ok, not_found or
  // timeout; throws for everything else.
  Reply call(Command command, const Bytes& body, const std::string& what,
             std::optional<milliseconds> wait = std::nullopt);
  void set_request_timeout(milliseconds timeout);
  std::string where() const { return host_ + ":" + std::to_string(port_); }

 private:
  template <class Start>
  error_code run_until(Start start, Clock::time_point deadline);
  void connect(Clock::time_point deadline, milliseconds connect_timeout);
  bool try_connect(Clock::time_point deadline, error_code& last);
  // False when the server hung up before answering.
  bool handshake();
  void write_all(const Bytes& bytes, const Exchange& exchange);
  Bytes read_exact(std::size_t bytes, const Exchange& exchange);
  [[noreturn]] void fail(const error_code& ec, const Exchange& exchange);
  [[noreturn]] void fail_with(const std::string& why, const Exchange& exchange);

  std::string host_;
  std::uint16_t port_;
  std::string token_;
  std::mutex mutex_;
  milliseconds request_timeout_;
  asio::io_context io_{1};
  tcp::socket socket_{io_};
  std::string broken_;  // why the connection is unusable; empty while it is fine
};

Store::Impl::Impl(std::string host, std::uint16_t port, std::string token, milliseconds connect_timeout)
    : host_(std::move(host)), port_(port), token_(std::move(token)), request_timeout_(connect_timeout) {
  // Until told otherwise (set_request_timeout) every request, the handshake
  // first, is bounded by the same timeout the caller gave for connecting.
  auto deadline = Clock::now() + connect_timeout;
  connect(deadline, connect_timeout);
  while (!handshake()) {
    // A flooded server drops the oldest connections waiting for their
    // handshake; ours was one of them, so try again (store_server.h).
    if (Clock::now() + kConnectRetry >= deadline)
      throw RemoteError("the store at " + where() + " closed every connection before answering the " +
                        "handshake for " + ms_text(connect_timeout) +
                        "; it may be flooded with connections (see its log)");
    std::this_thread::sleep_for(kConnectRetry);
    connect(deadline, connect_timeout);
  }
}

// Runs one asynchronous operation to completion or until the deadline; on
// the deadline, closing the socket makes the operation finish (aborted), and
// timed_out is returned.
template <class Start>
error_code Store::Impl::run_until(Start start, Clock::time_point deadline) {
  std::optional<error_code> result;
  io_.restart();
  start([&result](error_code ec, auto&&...) { result = ec; });
  while (!result && Clock::now() < deadline) io_.run_one_until(deadline);
  if (!result) io_.poll();  // an operation that completed right at the deadline still counts
  if (result) return *result;
  error_code ignored;
  socket_.close(ignored);
  io_.restart();
  io_.run();
  return asio::error::timed_out;
}

// The server may start after its clients, so a failed connection is retried
// every kConnectRetry until connect_timeout has passed. A host name is
// resolved by the system resolver, whose own timeouts bound that step.
void Store::Impl::connect(Clock::time_point deadline, milliseconds connect_timeout) {
  error_code last;
  while (!try_connect(deadline, last)) {
    auto now = Clock::now();
    if (now >= deadline)
      throw TimeoutError("no store answered at " + where() + " within " + ms_text(connect_timeout) +
                         " (last error: " + (last == asio::error::timed_out ? "no answer" : last.message()) +
                         "); is the launcher or rank 0 running and serving the store?");
    std::this_thread::sleep_until(std::min(now + kConnectRetry, deadline));
  }
  error_code ignored;
  socket_.set_option(tcp::no_delay(true), ignored);
}

bool Store::Impl::try_connect(Clock::time_point deadline, error_code& last) {
  tcp::resolver resolver(io_);
  auto endpoints = resolver.resolve(host_, std::to_string(port_), last);
  for (const auto& entry : endpoints) {
    last = run_until([&](auto handler) { socket_.async_connect(entry.endpoint(), handler); }, deadline);
    if (!last) return true;
    error_code ignored;
    socket_.close(ignored);
  }
  return false;
}

bool Store::Impl::handshake() {
  Bytes hello(kMagic, kMagic + sizeof kMagic);
  put_u32(hello, kStoreProtocolVersion);
  put_u32(hello, static_cast<std::uint32_t>(token_.size()));
  put_text(hello, token_);
  Exchange exchange(request_timeout_, "during the handshake");
  Bytes header(kHandshakeReplyHeaderBytes);
  error_code ec = run_until(
      [&](auto handler) { asio::async_write(socket_, asio::buffer(hello), handler); }, exchange.deadline);
  if (!ec)
    ec = run_until([&](auto handler) { asio::async_read(socket_, asio::buffer(header), handler); },
                   exchange.deadline);
  if (is_hang_up(ec)) {
    error_code ignored;
    socket_.close(ignored);
    return false;
  }
  if (ec) fail(ec, exchange);
  std::uint32_t message_bytes = load_u32(header.data() + 1);
  if (message_bytes > kMaxMessageBytes) fail_with("it sent a malformed handshake reply", exchange);
  Bytes message = read_exact(message_bytes, exchange);
  if (header[0] != 0)
    throw RemoteError(std::string(message.begin(), message.end()) + " (store at " + where() + ")");
  return true;
}

Reply Store::Impl::call(Command command, const Bytes& body, const std::string& what,
                        std::optional<milliseconds> wait) {
  std::lock_guard lock(mutex_);
  if (!broken_.empty())
    throw RemoteError("the connection to the store at " + where() +
                      " is unusable after an earlier failure (" + broken_ + ")");
  Exchange exchange(wait ? *wait + kAnswerMargin : request_timeout_, what);
  write_all(frame(std::uint8_t(command), body), exchange);
  Bytes header = read_exact(kFrameHeaderBytes, exchange);
  std::uint32_t body_bytes = load_u32(header.data());
  if (body_bytes > kMaxRequestBytes + kMaxMessageBytes) fail_with("it sent a malformed response", exchange);
  Reply reply{Status(header[4]), read_exact(body_bytes, exchange)};
  std::string text(reply.body.begin(), reply.body.end());
  switch (reply.status) {
    case Status::ok:
    case Status::not_found:
    case Status::timeout: return reply;
    case Status::bad_value: throw InvalidUsage(text + " (store at " + where() + ", " + exchange.what + ")");
    case Status::bad_request: fail_with("it rejected a request: " + text, exchange);
  }
  fail_with("it answered with unknown status " + std::to_string(header[4]), exchange);
}

void Store::Impl::set_request_timeout(milliseconds timeout) {
  std::lock_guard lock(mutex_);
  request_timeout_ = timeout;
}

void Store::Impl::write_all(const Bytes& bytes, const Exchange& exchange) {
  error_code ec = run_until(
      [&](auto handler) { asio::async_write(socket_, asio::buffer(bytes), handler); }, exchange.deadline);
  if (ec) fail(ec, exchange);
}

Bytes Store::Impl::read_exact(std::size_t bytes, const Exchange& exchange) {
  Bytes out(bytes);
  error_code ec = run_until(
      [&](auto handler) { asio::async_read(socket_, asio::buffer(out), handler); }, exchange.deadline);
  if (ec) fail(ec, exchange);
  return out;
}

void Store::Impl::fail(const error_code& ec, const Exchange& exchange) {
  error_code ignored;
  socket_.close(ignored);
  if (ec == asio::error::timed_out) {
    broken_ = "it did not answer in time";
    throw TimeoutError("store at " + where() + " did not answer within " + ms_text(exchange.timeout) + " " +
                       exchange.what);
  }
  if (is_hang_up(ec)) {
    broken_ = "it closed the connection";
    throw RemoteError("the store at " + where() + " closed the connection " + exchange.what +
                      "; the launcher or rank 0 may have exited");
  }
  broken_ = ec.message();
  throw SystemError("talking to the store at " + where() + " failed " + exchange.what + ": " + ec.message());
}

void Store::Impl::fail_with(const std::string& why, const Exchange& exchange) {
  error_code ignored;
  socket_.close(ignored);
  broken_ = why;
  throw RemoteError("the store at " + where() + " broke the protocol " + exchange.what + ": " + why);
}

// ---- Store ---------------------------------------------------------------

Store::Store(const std::string& host, std::uint16_t port, std::string token, milliseconds connect_timeout)
    : impl_(std::make_unique<Impl>(host, port, std::move(token), connect_timeout)) {}

Store::~Store() = default;

void Store::set(const std::string& key, const Bytes& value) {
  Bytes body;
  put_key(body, key);
  body.insert(body.end(), value.begin(), value.end());
  impl_->call(Command::set, body, "while setting key '" + key + "'");
}

void Store::set(const std::string& key, const std::string& value) {
  set(key, Bytes(value.begin(), value.end()));
}

Bytes Store::get(const std::string& key, milliseconds timeout) {
  Bytes body;
  put_u32(body, wire_ms(timeout));
  put_key(body, key);
  Reply reply = impl_->call(Command::get, body, "while waiting for key '" + key + "'", timeout);
  if (reply.status != Status::ok)
    throw TimeoutError("key '" + key + "' did not appear in the store at " + impl_->where() +
                       " within " + ms_text(timeout) +
                       "; the rank that sets it may have failed or not reached that point");
  return std::move(reply.body);
}

std::string Store::get_string(const std::string& key, milliseconds timeout) {
  Bytes value = get(key, timeout);
  return std::string(value.begin(), value.end());
}

std::optional<Bytes> Store::try_get(const std::string& key) {
  Bytes body;
  put_key(body, key);
  Reply reply = impl_->call(Command::try_get, body, "while reading key '" + key + "'");
  if (reply.status != Status::ok) return std::nullopt;
  return std::move(reply.body);
}

void Store::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  Bytes body;
  put_u32(body, wire_ms(timeout));
  put_keys(body, keys);
  Reply reply = impl_->call(Command::wait, body, "while waiting for keys " + join_keys(keys), timeout);
  if (reply.status == Status::ok) return;
  WireReader in(reply.body);
  throw TimeoutError("keys " + join_keys(in.keys()) + " did not appear in the store at " + impl_->where() +
                     " within " + ms_text(timeout) + " (waited for " + join_keys(keys) +
                     "); the ranks that set them may have failed or not reached that point");
}

std::int64_t Store::add(const std::string& key, std::int64_t delta) {
  Bytes body;
  put_i64(body, delta);
  put_key(body, key);
  Reply reply = impl_->call(Command::add, body, "while adding to key '" + key + "'");
  WireReader in(reply.body);
  return in.i64();
}

bool Store::remove(const std::string& key) {
  Bytes body;
  put_key(body, key);
  Reply reply = impl_->call(Command::remove, body, "while deleting key '" + key + "'");
  return !reply.body.empty() && reply.body[0] != 0;
}

void Store::set_request_timeout(milliseconds timeout) { impl_->set_request_timeout(timeout); }

}  // namespace braid::runtime
