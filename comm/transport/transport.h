// A Transport moves framed messages between this rank and its peers. It
// never reduces and never knows which collective it serves: it sends a
// header plus payload, and for a receive it checks the arriving header
// against the one the caller expects (comm/wire.h) before any payload byte
// is handed over.
//
// Requests are posted without blocking and complete in posting order per
// peer and direction. A receive either lands in the caller's buffer, or, when
// posted without one, stays in transport memory and is handed out as a view
// (a span into a staging buffer for TCP, the shared ring for shm) that the
// caller reduces from and then releases. progress() does all the I/O; it is
// called by one thread at a time (the thread running the communicator's
// current operation) and never blocks past the deadline it is given.
#pragma once

#include "comm/transport/transport_only.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "comm/types.h"
#include "comm/wire.h"
#include "runtime/errors.h"

namespace braid::comm {

using RequestId = std::uint32_t;

// What every transport's factory (connect_shm, connect_tcp, open_ibverbs)
// needs of its communicator; setup.cc fills it once and each transport's
// options add their own fields.
struct ConnectOptions {
  int rank = 0;
  int size = 1;
  std::uint32_t comm_id = 0;
  std::string job_token;  // every connection proves it (transport-specific handshake)
  std::chrono::nanoseconds spin{};  // how long progress() polls before it sleeps
  std::chrono::milliseconds timeout{300'000};
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string_view name() const = 0;

  virtual RequestId post_send(int peer, const WireHeader& header, const void* data) = 0;
  // data == nullptr: receive into transport memory, read it with view().
  virtual RequestId post_recv(int peer, const WireHeader& expected, void* data, Placement placement) = 0;

  // Whether the request has completed; throws the error that failed it.
  virtual bool is_done(RequestId request) = 0;
  // The payload of a completed view receive; valid until release().
  virtual std::span<const std::byte> view(RequestId request) = 0;
  // Frees a completed request (every request must be released once).
  virtual void release(RequestId request) = 0;

  // Advances every posted request as far as possible without blocking; when
  // nothing could advance, waits for I/O until `deadline` at the latest.
  // Returns whether anything advanced. Throws RemoteError when a peer closes
  // its connection or sends a mismatched header, SystemError on local
  // failures; after a throw the transport is unusable.
  virtual bool progress(Clock::time_point deadline) = 0;

  // Closes every connection so that peers blocked on this rank fail fast.
  virtual void shutdown() = 0;

  // Registered memory. find_region: whether [data, data + bytes) lies in
  // memory this rank registered that this transport can hand its peers;
  // fills `ref` if so. map_region: the bytes `ref` names in `peer`'s
  // registered memory as a span here (shm maps the peer's region), after
  // checking them against what the peer really registered: RemoteError
  // when `ref` lies outside it, InvalidUsage from a transport that cannot
  // reach a peer's memory (the defaults).
  virtual bool find_region(const void* data, std::size_t bytes, RegionRef& ref);
  virtual std::span<std::byte> map_region(int peer, const RegionRef& ref);

  // Bytes of payload moved, for traffic accounting.
  virtual std::uint64_t bytes_sent() const = 0;
  virtual std::uint64_t bytes_received() const = 0;
};

inline bool Transport::find_region(const void*, std::size_t, RegionRef&) { return false; }

inline std::span<std::byte> Transport::map_region(int peer, const RegionRef&) {
  throw InvalidUsage("the " + std::string(name()) + " transport cannot reach the registered memory of rank " +
                     std::to_string(peer));
}

}  // namespace braid::comm
