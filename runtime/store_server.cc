// The store server: its listening socket, the admission of connections
// (handshake deadline, the cap on pending handshakes, drops and their log)
// and its thread (the design is described in store_server.h).
// Boost 1.74's asio/awaitable.hpp uses std::exchange without including
// <utility>; GCC 12 in C++20 mode needs it included first.
#include <utility>

#include "runtime/store_server.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <random>

#include "runtime/errors.h"

namespace braid::runtime {
namespace store_server {
namespace {

// Drops of unauthenticated connections are summed up over this long.
constexpr std::chrono::seconds kDropLogInterval{5};
constexpr std::chrono::milliseconds kAcceptRetry{50};

std::uint64_t draw_instance() {
  std::random_device device;
  return std::uint64_t{device()} << 32 | device();
}

bool is_out_of_descriptors(const error_code& ec) {
  return ec == asio::error::no_descriptors || ec == boost::system::errc::too_many_files_open_in_system;
}

}  // namespace

// ---- DropLog -------------------------------------------------------------

void DropLog::record(DropReason reason, const std::string& remote) {
  ++counts_[static_cast<std::size_t>(reason)];
  last_remote_ = remote;
  if (armed_) return;
  write(true);
  arm();
}

void DropLog::refused(const std::string& remote, const std::string& why) {
  if (armed_) {
    ++refusals_;
    last_refusal_ = remote + ": " + why;
    return;
  }
  spdlog::warn("store refused connection from {}: {}", remote, why);
  arm();
}

void DropLog::arm() {
  armed_ = true;
  timer_.expires_after(kDropLogInterval);
  timer_.async_wait([this](error_code ec) {
    if (ec) return;
    armed_ = false;
    const bool drops = counts_[0] + counts_[1] + counts_[2] > 0, refusals = refusals_ > 0;
    if (drops) write(false);
    if (refusals) write_refusals();
    if (drops || refusals) arm();
  });
}

void DropLog::write_refusals() {
  spdlog::warn("store on port {} refused {} more connection(s) in the last {} s (the last from {})", port_, refusals_,
               kDropLogInterval.count(), last_refusal_);
  refusals_ = 0;
}

void DropLog::write(bool first) {
  std::string causes;
  auto cause = [&causes](std::size_t count, const std::string& text) {
    if (count) causes += (causes.empty() ? "" : ", ") + std::to_string(count) + " " + text;
  };
  cause(counts_[0], "past the cap of " + std::to_string(limits_.max_pending_handshakes) +
                        " connections waiting for a handshake");
  cause(counts_[1], "without a complete handshake within " +
                        std::to_string(limits_.handshake_timeout.count()) + " ms");
  cause(counts_[2], "for lack of file descriptors");
  std::size_t total = counts_[0] + counts_[1] + counts_[2];
  std::string interval = std::to_string(kDropLogInterval.count()) + " s";
  spdlog::warn("store on port {} dropped {} unauthenticated connection(s){} (last from {}): {}; braid's own "
               "clients reconnect by themselves, so many drops mean something else is flooding the port{}",
               port_, total, first ? "" : " in the last " + interval, last_remote_, causes,
               first ? "; further drops are summed up every " + interval : "");
  counts_ = {};
}

// ---- ServerCore ----------------------------------------------------------

ServerCore::ServerCore(const std::string& bind_addr, const std::vector<std::uint16_t>& ports, std::string token,
                       const std::string& remedy, const StoreLimits& limits)
    : limits_(limits), token_(std::move(token)), instance_(draw_instance()), map_(limits.max_bytes) {
  limits_.max_pending_handshakes = std::max<std::size_t>(limits_.max_pending_handshakes, 1);
  open(bind_addr, ports, remedy);
  drops_.set_port(port_);
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

// A port in use (EADDRINUSE from bind, or from listen when another socket
// bound it with SO_REUSEADDR too) moves on to the next candidate; any other
// failure is the address's, which no other port would cure.
void ServerCore::open(const std::string& bind_addr, const std::vector<std::uint16_t>& ports,
                      const std::string& remedy) {
  error_code ec;
  auto address = asio::ip::make_address(bind_addr, ec);
  if (ec) throw InvalidUsage("store bind address '" + bind_addr + "' is not an IP address");
  if (ports.empty()) throw InvalidUsage("store: no port to listen on");
  std::string taken;
  for (std::uint16_t port : ports) {
    ec = listen_on(tcp::endpoint(address, port));
    if (!ec) {
      port_ = acceptor_.local_endpoint().port();
      if (port != ports.front())
        spdlog::info("store: port(s) {} on {} in use, so this job's store listens on {}, the next of its ports",
                     taken, bind_addr, port_);
      return;
    }
    std::string where = bind_addr + ":" + std::to_string(port);
    if (ports.size() == 1)
      throw SystemError("store cannot listen on " + where + ": " + ec.message() +
                        (port ? "; is another job using this port?" : ""));
    if (ec != asio::error::address_in_use)
      throw SystemError("store cannot listen on " + where + ": " + ec.message() + "; " + remedy);
    taken += (taken.empty() ? "" : ", ") + std::to_string(port);
  }
  throw SystemError("store cannot listen on " + bind_addr + ": every port this job may use is in use (" + taken +
                    "); " + remedy);
}

error_code ServerCore::listen_on(const tcp::endpoint& endpoint) {
  error_code ec;
  if (acceptor_.open(endpoint.protocol(), ec) ||
      acceptor_.set_option(tcp::acceptor::reuse_address(true), ec) || acceptor_.bind(endpoint, ec) ||
      acceptor_.listen(asio::socket_base::max_listen_connections, ec)) {
    error_code ignored;
    acceptor_.close(ignored);
  }
  return ec;
}

void ServerCore::accept() {
  acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) return on_accept_error(ec);
    if (pending_.size() >= limits_.max_pending_handshakes) pending_.oldest()->drop(DropReason::over_cap);
    socket.set_option(tcp::no_delay(true), ec);
    std::make_shared<Session>(std::move(socket), *this)->start();
    accept();
  });
}

// Out of file descriptors: dropping the oldest connection still waiting for
// its handshake frees one, so accept again at once. With none to drop (every
// descriptor serves a client with the token, or the process's own use), back
// off rather than spin, warning at most once per kDropLogInterval.
void ServerCore::on_accept_error(const error_code& ec) {
  if (is_out_of_descriptors(ec) && pending_.size() > 0) {
    pending_.oldest()->drop(DropReason::no_descriptors);
    return accept();
  }
  auto now = std::chrono::steady_clock::now();
  if (now - last_accept_warning_ >= kDropLogInterval) {
    last_accept_warning_ = now;
    spdlog::warn("store on port {} could not accept a connection: {}{}", port_, ec.message(),
                 is_out_of_descriptors(ec) ? "; raise the file-descriptor limit (ulimit -n)" : "");
  }
  accept_retry_.expires_after(kAcceptRetry);
  accept_retry_.async_wait([this](error_code wait_ec) {
    if (!wait_ec) accept();
  });
}

bool ServerCore::reserve_request(std::size_t bytes) {
  if (bytes > limits_.max_bytes - std::min(receiving_bytes_, limits_.max_bytes)) return false;
  receiving_bytes_ += bytes;
  return true;
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

}  // namespace store_server

StoreLimits store_limits(const Config& config) {
  StoreLimits limits;
  limits.max_bytes = config.store_max_bytes;
  limits.handshake_timeout = std::min<std::chrono::milliseconds>(config.timeout, std::chrono::seconds(10));
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0)
    limits.max_pending_handshakes = std::clamp<rlim_t>(nofile.rlim_cur / 4, kMinPendingHandshakes, 1024);
  return limits;
}

struct StoreServer::Impl : store_server::ServerCore {
  using ServerCore::ServerCore;
};

StoreServer::StoreServer(const std::string& bind_addr, std::uint16_t port, std::string token,
                         const StoreLimits& limits)
    : impl_(std::make_unique<Impl>(bind_addr, std::vector<std::uint16_t>{port}, std::move(token), "", limits)) {}

StoreServer::StoreServer(const std::string& bind_addr, const std::vector<std::uint16_t>& ports, std::string token,
                         const std::string& remedy, const StoreLimits& limits)
    : impl_(std::make_unique<Impl>(bind_addr, ports, std::move(token), remedy, limits)) {}

StoreServer::~StoreServer() = default;

std::uint16_t StoreServer::port() const { return impl_->port(); }

}  // namespace braid::runtime
