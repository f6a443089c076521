// The shared-memory transport: ranks of one host exchange messages through
// single-producer single-consumer byte rings in POSIX shared memory
// (memory.h describes the layout). A sender copies header and payload into
// the ring; a receiver checks the header, then either copies the payload
// out or, for a view, hands the algorithm a span straight into the ring and
// frees that space only when the algorithm releases it, so reductions read
// the peer's bytes where they landed. A receive posted as
// Placement::streamed is copied out with non-temporal stores.
//
// Waiting blocks on the rank's doorbell futex after a short bounded spin
// (none when the host has more local ranks than distinct CPUs in their
// affinities together, comm/setup.cc, so oversubscribed ranks yield their
// core at once). A peer that dies is noticed through its
// pidfd, and one that fails or closes through the `closed` flag in its
// segment, each within one sleep slice (50 ms), never a hang.
//
// When every rank of the communicator is on this host, the transport also
// offers the ranks' shared slots (slots.h), where small collectives move
// their data and its arrival flag in one cache line.
#pragma once

#include "comm/transport/transport_only.h"

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport/shm/memory.h"
#include "comm/transport/shm/slots.h"
#include "comm/transport/pools.h"
#include "comm/transport/transport.h"

namespace braid::runtime {
class Store;
}

namespace braid::comm::shm {

struct ShmOptions : ConnectOptions {
  std::vector<int> local_ranks;   // every rank of this host in the communicator, sorted, this one included
  std::size_t ring_bytes = 4u << 20;  // per channel, rounded up to a power of two
  std::size_t host_bytes = 1u << 30;  // budget of all rings of this host together (ring_capacity())
};

class ShmTransport;

inline constexpr std::size_t kMinRingBytes = 64u << 10;

// Bytes of each ring when `local_ranks` ranks share a host: `ring_bytes`
// rounded up to a power of two, halved while the host's local_ranks x
// (local_ranks - 1) rings would together take more than `host_bytes`, but
// never below kMinRingBytes (past about 128 local ranks the total passes the
// budget rather than the rings shrinking further). A pure function of its
// arguments, so every rank of a host derives the same size.
std::size_t ring_capacity(std::size_t local_ranks, std::size_t ring_bytes, std::size_t host_bytes);

// Unlinks the segment `name` (shm_open's form, with its '/') where its
// header names an owner of this PID namespace that no longer exists: one a
// rank killed in set-up left, with no launcher to remove it. Set-up calls
// it before creating its own.
void remove_stale_segment(const std::string& name);

// Creates this rank's segment, maps every local peer's, waits until all have
// mapped each other, then unlinks its own name so nothing stays in /dev/shm.
// A rank that fails (e.g. /dev/shm too small: a SystemError naming the bytes
// needed and free and the remedies) fails its local peers too, at once,
// with a RemoteError that carries its reason.
std::unique_ptr<ShmTransport> connect_shm(runtime::Store& store, const std::string& key_prefix,
                                          const ShmOptions& options);

class ShmTransport final : public Transport {
 public:
  struct Link;  // one local peer: its mapping, both channels, queues
  ShmTransport(const ShmOptions& options, Mapping mine, std::vector<std::unique_ptr<Link>> links);
  ~ShmTransport() override;

  std::string_view name() const override { return "shm"; }
  RequestId post_send(int peer, const WireHeader& header, const void* data) override;
  RequestId post_recv(int peer, const WireHeader& expected, void* data, Placement placement) override;
  bool is_done(RequestId request) override;
  std::span<const std::byte> view(RequestId request) override;
  void release(RequestId request) override;
  bool progress(Clock::time_point deadline) override;
  void interrupt() override;
  void shutdown() override;
  // Writes `reason` into this rank's segment header (SegmentHeader::farewell).
  void farewell(const std::string& reason) override;
  std::uint64_t bytes_sent() const override { return bytes_sent_; }
  std::uint64_t bytes_received() const override { return bytes_received_; }
  // Registered memory: regions::find here, and a peer's region opened
  // through the pidfd this rank holds on it (memory.h).
  bool find_region(const void* data, std::size_t bytes, RegionRef& ref) override;
  std::span<std::byte> map_region(int peer, const RegionRef& ref) override;
  // Shared slots (slots.h), when every rank of the communicator is local.
  SharedSlots* shared_slots() override { return slots_.get(); }
  bool has_unread(int peer) override;
  std::string gone(int peer) override;

 private:
  struct Request {
    bool done = false, header_done = false;
    bool in_place = false;  // a view served straight from the ring
    bool released = false;
    Placement placement = Placement::cached;  // how a payload is copied out of the ring
    int peer = -1;
    WireHeader header, received;
    std::byte* data = nullptr;
    std::size_t moved = 0;  // padded payload bytes moved
    std::uint64_t ring_start = 0;                // in-place views: where the held ring bytes start
    std::byte inline_data[8];                    // a view of a payload that fit in its header slot
    Staging staging;
  };

  RequestId allocate(int peer, const WireHeader& header);
  Link& link(int peer);
  bool pump_sends(Link& link);
  bool pump_recvs(Link& link);
  bool pump_all();
  void free_consumed(Link& link);
  void ring_doorbell(SegmentHeader* owner);
  // Whether its own look at the rings moved anything.
  bool sleep_until(Clock::time_point deadline);
  bool check_peers();

  int rank_;
  std::size_t capacity_;
  std::chrono::nanoseconds spin_;
  int yields_ = 4;
  static constexpr std::chrono::nanoseconds kPollOnly{2000};  // of the spin, before yields
  Mapping mine_;
  std::vector<std::unique_ptr<Link>> links_;
  std::vector<Link*> by_rank_;
  std::unique_ptr<ShmSlots> slots_;
  RequestPool<Request> requests_;
  StagingPool staging_;
  std::atomic<std::uint64_t> bytes_sent_{0}, bytes_received_{0};
  bool shut_down_ = false;
  std::atomic<bool> interrupted_{false};  // interrupt() since the last sleep
  // Polled (progress with a deadline passed), peers are looked for at most
  // this often: a poll() of each pidfd with work pending.
  static constexpr std::chrono::milliseconds kPolledPeerLook{50};
  Clock::time_point next_peer_look_{};
};

}  // namespace braid::comm::shm
