// Registered memory of the ibverbs transport: page-aligned buffers the
// device may read (send staging) or write remotely (receive rings, credit
// words). Registration pins the pages and yields the lkey this rank's work
// requests use and the rkey a peer's RDMA writes present; the peer learns
// the address, length and rkey of each ring through the store at set-up and
// never writes outside it (the device checks the rkey's bounds).
//
// The caller's own buffers are registered for direct writes of large
// messages (transport.h) through a RegistrationCache: bounded in entries and
// bytes, least recently used entries unregistered first, never one a request
// still uses. A registration pins the pages that backed the buffer when it
// was made; if the program later frees the buffer and gets new memory at the
// same address, the old registration would silently read or write the old
// pages. So a cached entry is used again only after checking that the
// memory is still the same:
//  - Communicator::allocate's memory: the same memfd (inode) still backs the
//    address (regions::find, cheap), and the whole allocation is registered
//    once;
//  - any other buffer: every page still maps the page frame it mapped at
//    registration (/proc/self/pagemap, one read per use). Where this process
//    cannot read page frame numbers (they read as 0 without CAP_SYS_ADMIN),
//    user buffers are not registered at all and travel through the rings.
#pragma once

#include "comm/transport/transport_only.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

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

// A pinned registration covering a caller's buffer.
struct MemoryKey {
  std::uint64_t region_base = 0;  // what the registration covers
  std::uint64_t region_bytes = 0;
  std::uint32_t lkey = 0, rkey = 0;
  int entry = -1;  // give back with RegistrationCache::unpin
};

class RegistrationCache {
 public:
  RegistrationCache(ibv_pd* pd, std::size_t max_bytes, std::size_t max_entries);
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;
  ~RegistrationCache();

  // A registration covering [data, data + bytes), pinned until unpin(); none
  // when the memory cannot be registered safely here (see the top of this
  // file), or the cache is full of pinned entries, or the device refuses
  // (RLIMIT_MEMLOCK): the caller then copies through its rings.
  std::optional<MemoryKey> pin(const void* data, std::size_t bytes);
  void unpin(const MemoryKey& key);

  std::size_t registered_bytes() const { return bytes_; }

 private:
  struct Entry {
    ibv_mr* mr = nullptr;
    const std::byte* base = nullptr;
    std::size_t bytes = 0;
    std::uint64_t inode = 0;           // Communicator::allocate's memory; 0 for other buffers
    std::vector<std::uint64_t> frames;  // other buffers: page frame per page at registration
    int pins = 0;
    std::uint64_t last_use = 0;
  };
  bool still_valid(const Entry& e, const std::byte* data, std::size_t bytes);
  bool read_frames(const std::byte* page, std::size_t pages, std::vector<std::uint64_t>& frames);
  int find(const std::byte* data, std::size_t bytes);
  int add(const std::byte* base, std::size_t bytes, std::uint64_t inode);
  bool make_room(std::size_t bytes);
  void drop(std::size_t index);

  ibv_pd* pd_;
  std::size_t max_bytes_, max_entries_, bytes_ = 0, live_ = 0;
  std::uint64_t clock_ = 0;
  std::vector<Entry> entries_;
  std::vector<std::uint64_t> frames_now_;  // still_valid's read, kept: no allocation per message
  int pagemap_ = -1;        // /proc/self/pagemap, or -1
  bool frames_readable_ = false;
  bool refused_logged_ = false;        // a registration refused for the locked-memory limit was logged
  bool other_refusal_logged_ = false;  // one refused for another cause
};

}  // namespace braid::comm::ibverbs
