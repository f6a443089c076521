// The rendezvous store: a TCP key-value service on Boost.Asio through which
// ranks exchange everything they need to find each other (peer addresses,
// shared-memory names, CUDA IPC handles, status for timeout attribution).
//
// StoreServer runs in braid-launch (or in rank 0 when no launcher serves it)
// on its own thread. Store is the client: one connection, one request at a
// time (a mutex serialises callers), every request bounded by a timeout.
//
// Wire protocol (all integers little-endian):
//   handshake, client -> server: "BRDS" u32 version, u32 token_bytes, token
//   handshake, server -> client: u8 status (0 ok, 2 wrong token, else refused) + u32 msg_bytes, msg
//   request:  u32 body_bytes, u8 command, body
//   response: u32 body_bytes, u8 status, body
// A connection with a wrong token or version, a request larger than
// kMaxRequestBytes, or a malformed body is answered with an error status
// where possible, logged, and closed; the server keeps serving the others.
//
// The server guards itself (StoreLimits): a connection must complete its
// handshake within a deadline, only so many may be waiting to do so (one
// more, or running out of file descriptors, drops the oldest of them), and
// the keys and values of a job are bounded in bytes. Drops are logged at
// most once per few seconds. A set past the byte limit is answered with an
// error naming it, and the connection stays usable.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/config.h"

namespace braid::runtime {

// 2: remove_prefix; 3: the handshake's acceptance carries the store's
// instance (store_wire.h)
inline constexpr std::uint32_t kStoreProtocolVersion = 3;
inline constexpr std::size_t kMaxRequestBytes = 64u << 20;

using Bytes = std::vector<std::uint8_t>;

// What one store server may spend on its job, so that neither a flood of
// connections nor a client with the token can exhaust the process serving it.
struct StoreLimits {
  // Bytes of keys and values held (each key also costs
  // kStoreEntryOverheadBytes; a value still being sent to a client counts
  // until it is sent). A set or add past it fails with InvalidUsage naming
  // BRAID_STORE_MAX_BYTES. Requests being received are bounded by a second
  // budget of the same size, so the store holds at most about twice this.
  std::size_t max_bytes = 64u << 20;
  // How long a new connection may take to send its whole handshake.
  std::chrono::milliseconds handshake_timeout{10'000};
  // Connections accepted whose handshake is not complete yet. Accepting one
  // more drops the oldest: an idle connection is old by the time a real
  // client, which sends its handshake at once, arrives behind it.
  std::size_t max_pending_handshakes = 256;
};

inline constexpr std::size_t kStoreEntryOverheadBytes = 64;
// store_limits() never allows fewer pending handshakes than this.
inline constexpr std::size_t kMinPendingHandshakes = 16;

// The limits for this process: BRAID_STORE_MAX_BYTES, a handshake deadline
// of min(BRAID_TIMEOUT, 10 s), and at most a quarter of the soft
// RLIMIT_NOFILE (16 to 1024) connections waiting for their handshake.
StoreLimits store_limits(const Config& config);

class StoreServer {
 public:
  // Listens on bind_addr:port (port 0 picks a free one) and serves on a
  // background thread until destroyed. Throws SystemError if it cannot bind.
  StoreServer(const std::string& bind_addr, std::uint16_t port, std::string token,
              const StoreLimits& limits = store_limits(config()));
  // Listens on the first of `ports` (a job's candidate ports,
  // store_ports.h) that is free on bind_addr: a port in use, by anything,
  // moves on to the next; any other failure throws SystemError at once.
  // When every port is in use, throws SystemError naming them and `remedy`
  // (what to set).
  StoreServer(const std::string& bind_addr, const std::vector<std::uint16_t>& ports, std::string token,
              const std::string& remedy, const StoreLimits& limits = store_limits(config()));
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  std::uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class Store {
 public:
  // Connects, retrying until `connect_timeout` has passed (the server may
  // start after the client, or drop the connection unanswered while it is
  // flooded), then performs the handshake. The handshake and every later
  // request are bounded by `connect_timeout` too, until
  // set_request_timeout(). Throws TimeoutError if no server answered,
  // RemoteError if it refused the token.
  Store(const std::string& host, std::uint16_t port, std::string token,
        std::chrono::milliseconds connect_timeout);
  // Finds this job's store among `ports` (a job's candidate ports,
  // store_ports.h) on host: tries them in order, round after round until
  // `timeout`, and keeps the first whose server accepts the token. Another
  // job's store refuses the token, and so does anything that is not a braid
  // store; such a port is tried again only every second, while one where
  // nothing listens yet is tried again at once. Throws RemoteError when a
  // port refused the token and none accepted it, TimeoutError when none
  // answered; both name each port, what it said, and `remedy`. Warns once
  // when a few seconds pass without success.
  static std::unique_ptr<Store> find(const std::string& host, const std::vector<std::uint16_t>& ports,
                                     std::string token, std::chrono::milliseconds timeout,
                                     const std::string& remedy);
  // One attempt, answered within `timeout`: whether a store of the job
  // `token` names listens on host:port (it took the token). Never throws
  // for what the port says or does not say.
  static bool takes_token(const std::string& host, std::uint16_t port, std::string token,
                          std::chrono::milliseconds timeout);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Throws InvalidUsage, naming BRAID_STORE_MAX_BYTES, when the store's
  // byte limit leaves no room for the value; the connection stays usable.
  void set(const std::string& key, const Bytes& value);
  void set(const std::string& key, const std::string& value);
  // Waits until the key exists, then returns its value; TimeoutError names the key.
  Bytes get(const std::string& key, std::chrono::milliseconds timeout);
  std::string get_string(const std::string& key, std::chrono::milliseconds timeout);
  // Returns the value if the key exists now, without waiting.
  std::optional<Bytes> try_get(const std::string& key);
  // try_get and set bounded by `deadline` in all, the wait for this
  // connection included: another thread's request holds it until answered,
  // which a store that stopped answering does only at that request's
  // timeout. For a failure path that must not add a request timeout of its
  // own to the one that has already passed (comm/status.cc). TimeoutError
  // when the deadline passes: while waiting for the connection; or while
  // waiting for the answer, which closes the connection, as any request's
  // timeout does (the next request opens a new one).
  std::optional<Bytes> try_get(const std::string& key, std::chrono::steady_clock::time_point deadline);
  void set(const std::string& key, const std::string& value, std::chrono::steady_clock::time_point deadline);
  // Waits until every key exists; TimeoutError names the keys still missing.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Atomically adds delta to the integer counter at key (absent = 0) and
  // returns the new value. The counter is stored as decimal text, so get()
  // on it returns e.g. "42" and set(key, "10") seeds it; add on a key whose
  // value is not a decimal int64 throws InvalidUsage. Request bodies and
  // statuses are detailed in runtime/store_wire.h.
  std::int64_t add(const std::string& key, std::int64_t delta);
  // Deletes the key; returns whether it existed.
  bool remove(const std::string& key);
  // Deletes every key that starts with `prefix` and with none of `spare`
  // (a communicator's keys, sparing those of its splits); returns how many.
  // Bounded by `deadline`, as the bounded try_get is.
  std::size_t remove_prefix(const std::string& prefix, const std::vector<std::string>& spare,
                            std::chrono::steady_clock::time_point deadline);
  // add, bounded by `deadline` as the bounded try_get is.
  std::int64_t add(const std::string& key, std::int64_t delta, std::chrono::steady_clock::time_point deadline);

  // Default timeout for requests that do not wait on keys (set, add, ...).
  void set_request_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds request_timeout() const;
  // The port of the store this client is connected to.
  std::uint16_t port() const;

 private:
  struct Impl;
  explicit Store(std::unique_ptr<Impl> impl);
  std::optional<Bytes> try_get_until(const std::string& key,
                                     std::optional<std::chrono::steady_clock::time_point> deadline);
  std::int64_t add_until(const std::string& key, std::int64_t delta,
                         std::optional<std::chrono::steady_clock::time_point> deadline);
  std::unique_ptr<Impl> impl_;
};

}  // namespace braid::runtime
