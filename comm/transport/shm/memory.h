// Private to the shm transport: the layout of a rank's shared segment and
// the mapping that owns it.
//
// Each rank creates one segment holding its inbound channels, one per local
// peer, and maps the segments of its local peers to write into its channel
// there. A channel is a single-producer single-consumer byte ring:
//
//   head  bytes the sender has written (monotonic, the sender's only store)
//   tail  bytes the receiver has freed (monotonic, the receiver's only store)
//   ring  `capacity` bytes, a power of two; message bytes live at offset % capacity
//
// Every message is a 64-byte slot holding its WireHeader, then the payload
// padded to 64 bytes. A payload of at most capacity/2 never wraps: when it
// would, the sender first writes a wrap marker and restarts at offset 0, so
// the receiver can hand that payload to an algorithm as a view in place.
//
// When every rank of the communicator is on this host, the owner's shared
// slots (transport.h SharedSlots) lie between the header and the channels:
// kSlotDepth entries of kEntryStride bytes, each a 64-bit flag holding the
// sequence number of the call it was last published for, then its content;
// then kLargeSlots large slots of kLargeSlotBytes, each followed by a spare
// cache line so that writing one never touches a line of the next; then one
// 64-bit word per rank of the communicator, in which that rank, while it
// sleeps waiting for the owner's slot of call s, keeps s (0 otherwise), so
// that a publish finds whom to wake in its own memory (shm/slots.h).
//
// The segment header carries the owner's doorbell: a futex word peers bump
// (and wake, when the owner sleeps) whenever they write into its channels
// or free space in channels it writes to, so one futex wakes a rank for
// anything it may be waiting on.
#pragma once

#include "comm/transport/transport_only.h"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "comm/transport/transport.h"
#include "comm/types.h"

namespace braid::comm::shm {

inline constexpr std::uint64_t kSegmentMagic = 0x344d485344524242ull;  // "BBRDSHM4"
inline constexpr std::size_t kSlotBytes = 64;
inline constexpr std::uint32_t kWrapMagic = 0x50415257;  // "WRAP"

struct alignas(64) SegmentHeader {
  std::uint64_t magic;
  std::uint32_t owner_rank;
  std::uint32_t channels;
  std::uint64_t capacity;
  std::int64_t owner_pid;
  // The owner's PID namespace (the inode of /proc/self/ns/pid; 0: unknown):
  // owner_pid names the owner only for a peer in the same one.
  std::uint64_t owner_pid_ns;
  std::uint64_t slot_area;  // bytes of shared slots after this header (0: none)
  // The owner closed or failed; peers stop waiting on it. In the line that
  // is written rarely, as every publish of a shared slot looks at the words
  // below (SharedSlots::check_closed, wake_waiters), not in the doorbell's,
  // which sleepers and their wakers write.
  std::atomic<std::uint32_t> closed;
  // Raised by each peer as it closes (its own `closed` set), so that a
  // publish looks here rather than at every peer's; and, while peers sleep
  // waiting for this owner's shared slot, how many (shm/slots.h).
  std::atomic<std::uint32_t> peers_closed;
  std::atomic<std::uint32_t> sleepers;
  alignas(64) std::atomic<std::uint32_t> doorbell;
  std::atomic<std::uint32_t> sleeping;
  // Why the owner's communicator failed (ShmTransport::farewell), its
  // first `farewell_bytes` bytes, written before `closed` (0: none): a peer
  // that fails on this owner names the reason where the store that also
  // carries it was served by the rank that died, and went with it (ranks
  // 2 and 3 named only rank 1, or "rank 2 exited", never the rank 0 that
  // was killed; a review helper's case).
  alignas(64) std::atomic<std::uint32_t> farewell_bytes;
  char farewell[1020];
};

// What `header`'s owner said as it failed (SegmentHeader::farewell), or "".
std::string farewell_of(const SegmentHeader& header);

// Whether the process behind `pidfd` has exited, without waiting. False
// for -1 (no pidfd, as on an old kernel: its closed flag or the timeout
// still tells).
bool has_exited(int pidfd);

struct alignas(64) ChannelControl {
  alignas(64) std::atomic<std::uint64_t> head;
  alignas(64) std::atomic<std::uint64_t> tail;
};

// Entries: the flag and the first 56 bytes of content share a line; 1000
// bytes of payload fit after a 24-byte call header. A rank runs at most
// kSlotDepth - 1 calls ahead of the slowest (exchange_slots.cc). Large
// slots: 64 KiB + 32 bytes of payload.
inline constexpr std::size_t kSlotDepth = 512;
inline constexpr std::size_t kEntryStride = 1024;
inline constexpr std::size_t kLargeSlots = 2;
inline constexpr std::size_t kLargeSlotBytes = (64u << 10) + 32;
inline constexpr std::size_t kLargeStride = kLargeSlotBytes + 32 + 64;
inline constexpr std::size_t kSlotAreaBytes = kSlotDepth * kEntryStride + kLargeSlots * kLargeStride;
// The slot area of a communicator of `ranks`: the slots, then the words of
// the ranks that sleep waiting for them, filling whole lines.
inline constexpr std::size_t slot_area_bytes(std::size_t ranks) {
  return kSlotAreaBytes + (ranks * sizeof(std::uint64_t) + 63) / 64 * 64;
}
static_assert((kSlotDepth & (kSlotDepth - 1)) == 0 && kEntryStride % 64 == 0 && kLargeStride % 64 == 0,
              "entries and large slots start on cache lines");
static_assert(sizeof(std::uint64_t) + SharedSlots::kLineBytes == 64, "flag and first bytes share a line");

inline std::size_t channel_stride(std::size_t capacity) { return sizeof(ChannelControl) + capacity; }
inline std::size_t segment_bytes(std::size_t channels, std::size_t capacity, std::size_t slot_area) {
  return sizeof(SegmentHeader) + slot_area + channels * channel_stride(capacity);
}

// An mmap of a POSIX shared-memory object; unmapped on destruction. Mapped
// with MAP_POPULATE: the rings are allocated and entered in the page tables
// up front, not by page faults on the data path (each first touch of a ring
// page in each process cost microseconds inside the first collectives).
class Mapping {
 public:
  Mapping() = default;
  // Creates `name` exclusively (fails if it exists), zeroed, with all its
  // pages reserved in /dev/shm: when they cannot be had it throws a
  // SystemError that starts with `purpose` ("rank 3's shared-memory
  // segment (...)") and names the bytes needed, the bytes free and the
  // remedies, so a short /dev/shm fails here and never with SIGBUS later.
  static Mapping create(const std::string& name, std::size_t bytes, const std::string& purpose);
  // Opens an existing `name` of exactly `bytes`.
  static Mapping open(const std::string& name, std::size_t bytes);
  // Takes ownership of an existing mapping.
  static Mapping adopt(std::byte* data, std::size_t bytes);
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  ~Mapping();

  std::byte* data() const { return data_; }
  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(data_); }
  ChannelControl* channel(std::size_t index) const {
    return reinterpret_cast<ChannelControl*>(data_ + sizeof(SegmentHeader) + header()->slot_area +
                                             index * channel_stride(header()->capacity));
  }
  std::byte* ring(std::size_t index) const { return reinterpret_cast<std::byte*>(channel(index) + 1); }

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// futex on a word in shared memory (not FUTEX_PRIVATE: other processes wake it).
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds timeout);
void futex_wake_all(std::atomic<std::uint32_t>& word);

// Registered regions (Communicator::allocate): host memory the ranks of one
// host map into each other. Each allocation is an anonymous memfd
// (memfd_create), so nothing is named in /dev/shm and nothing outlives the
// processes. Its RegionRef key is (fd number, inode) in the owner's
// process; a peer opens it with pidfd_getfd through the pidfd it already
// holds on the owner (so a ref can only ever name memory of the peer that
// sent it), checks the inode (a reused fd number is another allocation) and
// that offset + bytes lie within the memfd's real size, and maps it.
namespace regions {

// Zeroed, 2 MiB-aligned within its memfd; throws SystemError when memory runs out.
void* allocate(std::size_t bytes);
// Frees an allocation; InvalidUsage for a pointer allocate() did not return.
void release(void* pointer);
// How many allocations this process has made, freed or not (tests: the
// staged copies that reuse their regions).
std::uint64_t allocations_made();
// Whether [pointer, pointer + bytes) lies in one allocation of this process.
bool find(const void* pointer, std::size_t bytes, RegionRef& ref);
// The whole allocation `pointer` lies in (its base, size and memfd inode):
// what the ibverbs transport registers once.
struct Extent {
  const std::byte* base = nullptr;
  std::size_t bytes = 0;
  std::uint64_t inode = 0;
};
bool extent(const void* pointer, Extent& out);

// A peer's regions mapped into this process, cached by fd number.
class PeerRegions {
 public:
  PeerRegions() = default;
  PeerRegions(const PeerRegions&) = delete;
  PeerRegions& operator=(const PeerRegions&) = delete;
  ~PeerRegions();
  // The bytes `ref` names, opened through `pidfd` (the owner's); RemoteError
  // naming `peer` when ref lies outside what the owner registered,
  // SystemError when the memfd cannot be opened (the peer exited).
  // Mappings of regions the owner has since freed are dropped before a new
  // region is mapped, and at most a second apart otherwise (drop_freed).
  std::span<std::byte> map(int pidfd, int peer, const RegionRef& ref);

 private:
  struct Mapped {
    std::byte* base = nullptr;
    std::size_t bytes = 0;
    std::uint64_t inode = 0;
  };
  void drop_freed(int pidfd);

  std::map<std::uint64_t, Mapped> by_fd_;
  std::chrono::steady_clock::time_point checked_{};
};

}  // namespace regions

}  // namespace braid::comm::shm
