// One store connection: its handshake, its requests, parked waits and
// writes (the design is described in store_server.h).
// Boost 1.74's asio/awaitable.hpp uses std::exchange without including
// <utility>; GCC 12 in C++20 mode needs it included first.
#include <utility>

#include "runtime/store_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "runtime/errors.h"

namespace braid::runtime::store_server {
namespace {

using namespace store_wire;

// Time a refused client gets to read our answer and hang up before we close.
constexpr std::chrono::seconds kLingerTime{1};

std::string endpoint_text(const tcp::socket& socket) {
  error_code ec;
  auto endpoint = socket.remote_endpoint(ec);
  return ec ? std::string("an unknown peer")
            : endpoint.address().to_string() + ":" + std::to_string(endpoint.port());
}

Bytes text_bytes(const std::string& text) { return Bytes(text.begin(), text.end()); }

}  // namespace

// ---- Session: handshake --------------------------------------------------

Session::Session(tcp::socket socket, ServerCore& server)
    : socket_(std::move(socket)), server_(server), remote_(endpoint_text(socket_)),
      timer_(socket_.get_executor()) {}

Session::~Session() {
  leave_pending();
  release_request();
}

void Session::start() {
  pending_ = server_.pending().add(this);
  timer_.expires_after(server_.limits().handshake_timeout);
  timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (!ec && self->pending_) self->drop(DropReason::no_handshake);
  });
  read_handshake();
}

void Session::drop(DropReason reason) {
  leave_pending();
  server_.drops().record(reason, remote_);
  error_code ignored;
  timer_.cancel();
  socket_.close(ignored);
}

void Session::leave_pending() {
  if (!pending_) return;
  server_.pending().remove(*pending_);
  pending_.reset();
}

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
        "wrong job token; the client belongs to another job (jobs on one node given the same port look past "
        "each other's stores for their own), or BRAID_JOB_TOKEN differs between ranks",
        kHandshakeWrongToken);
  spdlog::debug("store: accepted connection from {}", remote_);
  leave_pending();
  timer_.cancel();  // the handshake deadline
  body_ = Bytes{};
  Bytes reply{kHandshakeOk};
  put_u32(reply, kInstanceBytes);
  put_u64(reply, server_.instance());
  send(std::move(reply), &Session::read_request);
}

// A refused Session stays pending (and so can be dropped) until it closes.
void Session::refuse_handshake(const std::string& why, std::uint8_t status) {
  server_.drops().refused(remote_, why);
  std::string message = "store refused connection: " + why;
  Bytes reply{status};
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
  if (!server_.reserve_request(body_bytes)) {
    discard_bytes_ = body_bytes;
    return discard_request();
  }
  reserved_bytes_ = body_bytes;
  body_.resize(body_bytes);
  asio::async_read(socket_, asio::buffer(body_), [self = shared_from_this()](error_code ec, std::size_t) {
    if (!ec) self->on_request_body();
  });
}

// Reads a body that the request budget has no room for, a scratch buffer at
// a time, then says why it was not applied.
void Session::discard_request() {
  if (discard_bytes_ == 0) return respond(Status::bad_value, text_bytes(refusal_of_request()));
  std::size_t chunk = std::min(discard_bytes_, scratch_.size());
  asio::async_read(socket_, asio::buffer(scratch_, chunk),
                   [self = shared_from_this()](error_code ec, std::size_t bytes) {
                     if (ec) return;
                     self->discard_bytes_ -= bytes;
                     self->discard_request();
                   });
}

std::string Session::refusal_of_request() const {
  std::string max_bytes = std::to_string(server_.limits().max_bytes);
  std::uint32_t body_bytes = load_u32(header_.data());
  std::string why = body_bytes > server_.limits().max_bytes
                        ? "its limit is " + max_bytes + " bytes"
                        : "it is already receiving requests of nearly " + max_bytes + " bytes";
  return "the store cannot take a request of " + std::to_string(body_bytes) + " bytes: " + why +
         " (BRAID_STORE_MAX_BYTES); the store is meant for addresses and names, not data";
}

// A wait's key list costs the server far more than its bytes on the wire
// (a string per key, and the list of those still missing): each key claims
// kStoreEntryOverheadBytes of the request budget, as a stored key does of
// the map's, until the wait is answered. Claimed before the list is built.
void Session::reserve_for_keys(std::uint32_t count) {
  const std::size_t bytes = std::size_t{count} * kStoreEntryOverheadBytes;
  if (!server_.reserve_request(bytes))
    throw InvalidUsage("the store cannot take a wait for " + std::to_string(count) + " keys: each claims " +
                       std::to_string(kStoreEntryOverheadBytes) + " bytes of its request budget of " +
                       std::to_string(server_.limits().max_bytes) + " bytes (BRAID_STORE_MAX_BYTES)");
  reserved_bytes_ += bytes;
}

void Session::release_request() {
  server_.release_request(reserved_bytes_);
  reserved_bytes_ = 0;
  body_ = Bytes{};
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
    case Command::remove_prefix: return handle_remove_prefix(in);
    case Command::get: {
      auto timeout = std::chrono::milliseconds(in.u32());
      std::string key = in.key();
      in.expect_end();
      return wait_for_keys(command, {std::move(key)}, timeout);
    }
    case Command::wait: {
      auto timeout = std::chrono::milliseconds(in.u32());
      reserve_for_keys(in.count_ahead());
      auto keys = in.keys();
      in.expect_end();
      return wait_for_keys(command, std::move(keys), timeout);
    }
  }
  throw RemoteError("unknown store command " + std::to_string(header_[4]));
}

// The value is the rest of the body: it moves into the map without a copy.
void Session::handle_set(WireReader& in) {
  std::string key = in.key();
  Bytes value = std::move(body_);
  value.erase(value.begin(), value.begin() + static_cast<std::ptrdiff_t>(in.offset()));
  server_.map().set(key, std::move(value));
  respond(Status::ok, {});
  server_.key_added();
}

void Session::handle_try_get(WireReader& in) {
  std::string key = in.key();
  in.expect_end();
  Value value = server_.map().find(key);
  if (!value) return respond(Status::not_found, {});
  respond_value(std::move(value));
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

void Session::handle_remove_prefix(WireReader& in) {
  std::string prefix = in.key();
  reserve_for_keys(in.count_ahead());
  auto spare = in.keys();
  in.expect_end();
  Bytes reply;
  put_i64(reply, static_cast<std::int64_t>(server_.map().remove_prefix(prefix, spare)));
  respond(Status::ok, reply);
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
  if (parked.command == Command::get) return respond_value(server_.map().find(parked.keys[0]));
  respond(Status::ok, {});
}

// ---- Session: writing and closing ----------------------------------------

// Answering a request ends its claim on the request budget.
void Session::respond(Status status, const Bytes& body) {
  release_request();
  send(frame(std::uint8_t(status), body), &Session::read_request);
}

// The stored buffer itself goes out after the frame header, not a copy.
void Session::respond_value(Value value) {
  release_request();
  out_.clear();
  put_u32(out_, static_cast<std::uint32_t>(value->size()));
  out_.push_back(std::uint8_t(Status::ok));
  out_value_ = std::move(value);
  std::array<asio::const_buffer, 2> buffers{asio::buffer(out_), asio::buffer(*out_value_)};
  asio::async_write(socket_, buffers, [self = shared_from_this()](error_code ec, std::size_t) {
    self->out_value_.reset();
    if (!ec) self->read_request();
  });
}

void Session::reject(const std::string& why) {
  spdlog::warn("store closed the connection from {}: {}", remote_, why);
  release_request();
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

}  // namespace braid::runtime::store_server
