// Helpers for the store tests: clients with short timeouts, a free port, a
// bare POSIX client that can speak the wire protocol wrongly on purpose, and
// a flood of idle connections.
// Every blocking call here has a deadline, so a broken server fails a test
// instead of hanging it.
#pragma once

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/store.h"

namespace braid::test {

using namespace std::chrono_literals;
using runtime::Bytes;

inline const std::string kToken = "test-job-token";

inline std::unique_ptr<runtime::Store> connect_store(std::uint16_t port, const std::string& token = kToken,
                                                     std::chrono::milliseconds connect_timeout = 5s) {
  return std::make_unique<runtime::Store>("127.0.0.1", port, token, connect_timeout);
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A thread whose exception join() rethrows, so a failure in a helper thread
// fails the test instead of terminating the whole run.
class TestThread {
 public:
  explicit TestThread(std::function<void()> fn)
      : thread_([this, fn = std::move(fn)] {
          try {
            fn();
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  ~TestThread() {
    if (thread_.joinable()) thread_.join();
  }
  TestThread(const TestThread&) = delete;
  TestThread& operator=(const TestThread&) = delete;

  void join() {
    thread_.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
  std::thread thread_;
};

// Runs fn(0) .. fn(n - 1) on n threads at once and rethrows the first error.
inline void run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::unique_ptr<TestThread>> threads;
  for (int i = 0; i < n; ++i) threads.push_back(std::make_unique<TestThread>([&fn, i] { fn(i); }));
  for (auto& t : threads) t->join();
}

inline sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// A port that nothing listens on right now (the kernel just handed it out).
inline std::uint16_t unused_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = loopback(0);
  socklen_t addr_bytes = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &addr_bytes) != 0)
    throw std::runtime_error("cannot find a free port");
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A socket listening on 127.0.0.1:port (0: a kernel-chosen port) that
// accepts nothing, so connections complete in its backlog and are never
// answered: "something that is not a braid store".
class Squatter {
 public:
  explicit Squatter(std::uint16_t port = 0) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr = loopback(port);
    socklen_t addr_bytes = sizeof addr;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 64) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &addr_bytes) != 0) {
      if (fd_ >= 0) ::close(fd_);
      throw std::runtime_error("cannot listen on port " + std::to_string(port));
    }
    port_ = ntohs(addr.sin_port);
  }
  ~Squatter() { ::close(fd_); }
  Squatter(const Squatter&) = delete;
  Squatter& operator=(const Squatter&) = delete;
  std::uint16_t port() const { return port_; }

 private:
  int fd_;
  std::uint16_t port_ = 0;
};

// An IPv4 address of this machine other than loopback, if it has one.
inline std::optional<std::string> local_ipv4_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (ifaddrs* entry = list; entry && !found; entry = entry->ifa_next) {
    if (!entry->ifa_addr || entry->ifa_addr->sa_family != AF_INET || (entry->ifa_flags & IFF_LOOPBACK) ||
        !(entry->ifa_flags & IFF_UP))
      continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr, text, sizeof text);
    found = text;
  }
  ::freeifaddrs(list);
  return found;
}

inline Bytes le32_bytes(std::uint32_t value) {
  return {static_cast<std::uint8_t>(value), static_cast<std::uint8_t>(value >> 8),
          static_cast<std::uint8_t>(value >> 16), static_cast<std::uint8_t>(value >> 24)};
}

inline Bytes text_bytes(const std::string& text) { return Bytes(text.begin(), text.end()); }

// The parts, one after another.
inline Bytes cat(std::initializer_list<Bytes> parts) {
  std::size_t total = 0;
  for (const auto& part : parts) total += part.size();
  Bytes out(total);
  std::size_t at = 0;
  for (const auto& part : parts) {
    std::copy(part.begin(), part.end(), out.begin() + static_cast<std::ptrdiff_t>(at));
    at += part.size();
  }
  return out;
}

inline std::uint32_t le32(const Bytes& bytes, std::size_t at) {
  std::uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = value << 8 | bytes.at(at + i);
  return value;
}

// "BRDS" u32 version, u32 token_bytes, token, with every part replaceable.
inline Bytes hello(const std::string& token = kToken, std::uint32_t version = runtime::kStoreProtocolVersion,
                   const std::string& magic = "BRDS") {
  return cat({text_bytes(magic), le32_bytes(version), le32_bytes(static_cast<std::uint32_t>(token.size())),
              text_bytes(token)});
}

// u32 key_bytes, key.
inline Bytes key_field(const std::string& key) {
  return cat({le32_bytes(static_cast<std::uint32_t>(key.size())), text_bytes(key)});
}

// u32 body_bytes, u8 command, body.
inline Bytes request(std::uint8_t command, const Bytes& body) {
  return cat({le32_bytes(static_cast<std::uint32_t>(body.size())), Bytes{command}, body});
}

// A blocking TCP client to 127.0.0.1 whose reads all carry a deadline.
class RawClient {
 public:
  explicit RawClient(std::uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr = loopback(port);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      throw std::runtime_error("raw client cannot connect");
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  // Returns false if the peer has already closed (the send then fails).
  bool send(const Bytes& bytes) {
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }

  // Throws if the bytes do not all arrive within the timeout.
  Bytes recv_exact(std::size_t bytes, std::chrono::milliseconds timeout = 5s) {
    Bytes out(bytes);
    std::size_t got = 0;
    while (got < bytes) {
      ssize_t n = recv_some(out.data() + got, bytes - got, timeout);
      if (n <= 0) throw std::runtime_error("raw client: connection closed or timed out");
      got += static_cast<std::size_t>(n);
    }
    return out;
  }

  // True if the peer closes the connection (EOF or reset) within the timeout.
  bool closed_by_peer(std::chrono::milliseconds timeout = 5s) {
    std::uint8_t byte = 0;
    for (;;) {
      ssize_t n = recv_some(&byte, 1, timeout);
      if (n == 0 || (n < 0 && errno != ETIMEDOUT)) return true;
      if (n < 0) return false;
    }
  }

  // Reads a response frame: {status, body}.
  std::pair<std::uint8_t, std::string> recv_response() {
    Bytes header = recv_exact(5);
    Bytes body = recv_exact(le32(header, 0));
    return {header[4], std::string(body.begin(), body.end())};
  }

  // Reads the handshake reply: {status, message}.
  std::pair<std::uint8_t, std::string> recv_handshake_reply() {
    Bytes header = recv_exact(5);
    Bytes message = recv_exact(le32(header, 1));
    return {header[0], std::string(message.begin(), message.end())};
  }

 private:
  // recv with a deadline: -1 with errno ETIMEDOUT when nothing arrived.
  ssize_t recv_some(std::uint8_t* data, std::size_t bytes, std::chrono::milliseconds timeout) {
    pollfd pfd{fd_, POLLIN, 0};
    int ready = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
    if (ready <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    return ::recv(fd_, data, bytes, 0);
  }

  int fd_;
};

// `count` connections to 127.0.0.1:port that never send a byte, opened
// without waiting for each; closed by the destructor.
class Flood {
 public:
  Flood(std::uint16_t port, int count) {
    sockaddr_in addr = loopback(port);
    int failed = 0;
    for (int i = 0; i < count; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      fds_.push_back(fd);
      int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
      failed += rc != 0 && errno != EINPROGRESS;
    }
    if (fds_.size() == static_cast<std::size_t>(count) && failed == 0) return;
    for (int fd : fds_) ::close(fd);
    throw std::runtime_error("flood: only " + std::to_string(fds_.size() - failed) + " of " +
                             std::to_string(count) + " connections could be opened");
  }
  ~Flood() {
    for (int fd : fds_) ::close(fd);
  }
  Flood(const Flood&) = delete;
  Flood& operator=(const Flood&) = delete;

  // Waits until at least `wanted` of the connections were closed by the
  // server (EOF, reset or error), at most `limit`; returns how many were.
  std::size_t wait_closed(std::size_t wanted, std::chrono::milliseconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    std::vector<pollfd> polls;
    for (int fd : fds_) polls.push_back({fd, POLLIN, 0});
    std::size_t closed = 0;
    while (closed < wanted && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(20ms);
      ::poll(polls.data(), polls.size(), 0);
      closed = 0;
      for (const pollfd& p : polls) closed += (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    }
    return closed;
  }

 private:
  std::vector<int> fds_;
};

}  // namespace braid::test
