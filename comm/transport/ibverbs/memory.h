// Registered memory of the ibverbs transport: page-aligned buffers the
// device may read (send staging) or write remotely (receive rings, credit
// words). Registration pins the pages and yields the lkey this rank's work
// requests use and the rkey a peer's RDMA writes present; the peer learns
// the address, length and rkey of each ring through the store at set-up and
// never writes outside it (the device checks the rkey's bounds).
//
// Registering the caller's own buffers (Communicator::allocate's memory, a
// bounded cache of user buffers) and find_region / map_region for direct
// writes are not implemented yet: every payload is copied through the rings.
#pragma once

#include "comm/transport/transport_only.h"

#include <cstddef>
#include <cstdint>

struct ibv_mr;
struct ibv_pd;

namespace braid::comm::ibverbs {

class Registered {
 public:
  Registered() = default;
  // Allocates `bytes` (page-aligned, zeroed) and registers them with `pd`
  // for local writes and remote writes. Throws SystemError naming `what`.
  Registered(ibv_pd* pd, std::size_t bytes, const char* what);
  Registered(Registered&& other) noexcept;
  Registered& operator=(Registered&& other) noexcept;
  ~Registered();

  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  std::uint32_t lkey() const;
  std::uint32_t rkey() const;
  std::uint64_t address() const { return reinterpret_cast<std::uint64_t>(data_); }

 private:
  void reset();
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  ibv_mr* mr_ = nullptr;
};

}  // namespace braid::comm::ibverbs
