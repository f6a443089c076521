// Private to the shm transport: the shared slots (transport.h SharedSlots)
// of a communicator whose ranks all run on this host.
//
// A rank's slots live in its own segment (memory.h), so it writes only its
// own memory and reads its peers' slots through the mappings the transport
// already holds.
//
// Waking without a read-modify-write on the publisher's path, and without
// looking at any peer's memory while nobody sleeps: publish() stores the
// flag; wake_waiters() (the user's, once its own waits are over, or wait()'s
// before it sleeps) fences, then reads the count of sleepers in its own
// segment header (transport.h). Only where that is not zero does it read
// the sleepers' words in its own slot area (memory.h), and it rings the
// doorbell (increment + futex wake) of each rank that sleeps waiting for a
// call it has published; one waiting for a later call stays asleep. A
// sleeper writes its word and raises the count in the memory of the rank it
// waits for, then reads its own doorbell, looks at the flag once more and
// sleeps only while the doorbell still holds what it read. Either the
// sleeper's last look sees the flag or the publisher sees the sleeper and
// moves its doorbell, so a wake-up is never lost; by the time of the fence
// the flag's store has usually reached the peers, so it costs little, and
// ranks that spin exchange nothing but the slot lines themselves.
//
// A closing rank raises `peers_closed` in every peer's header as well as
// `closed` in its own, so that a publish looks at one word of its own
// rather than one per peer (SharedSlots::check_closed).
//
// A peer that runs the call with messages instead (a direct collective,
// whose schedule agrees by itself, against this rank's one-shot: their
// arguments or registered buffers differ) never publishes its slot, but
// its first message lands in this rank's ring: a waiter that finds a
// collective's message of this very call there fails at once, naming the
// peer's call, rather than at the timeout.
#pragma once

#include "comm/transport/transport_only.h"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "comm/transport/shm/memory.h"
#include "comm/transport/transport.h"

namespace braid::comm::shm {

class ShmSlots final : public SharedSlots {
 public:
  // A rank of the communicator as the slots see it; all of it stays owned by
  // the transport, which outlives this object.
  struct Rank {
    std::byte* segment = nullptr;          // its mapped segment (this rank's own included)
    int pidfd = -1;                        // on its process; -1 for this rank or none
    const ChannelControl* in = nullptr;    // its channel to this rank, and that channel's ring
    const std::byte* in_ring = nullptr;
  };
  ShmSlots(int rank, std::vector<Rank> ranks, std::size_t ring_capacity, std::chrono::nanoseconds spin);

  bool wait(int peer, std::uint64_t seq, Clock::time_point deadline) override;

 private:
  void wake_sleepers(std::uint64_t published) override;
  void find_closed(std::uint64_t seq) const override;
  SegmentHeader* header(int rank) const { return reinterpret_cast<SegmentHeader*>(ranks_[rank].segment); }
  // The words of `rank`'s slot area in which sleepers say what they await.
  std::atomic<std::uint64_t>* awaiting_in(int rank) const {
    return reinterpret_cast<std::atomic<std::uint64_t>*>(ranks_[rank].segment + sizeof(SegmentHeader) + kSlotAreaBytes);
  }
  bool sleep(int peer, std::uint64_t seq, Clock::time_point deadline);
  // Throws RemoteError where `peer` exited or closed, unless `awaited` (its
  // flag of call `seq`) shows that it published first.
  void check_alive(int peer, const std::atomic<std::uint64_t>* awaited = nullptr, std::uint64_t seq = 0) const;
  void check_stray(int peer, std::uint64_t seq) const;

  // How long wait() polls before it yields between looks (when it spins at
  // all), and how many times at least it yields before sleeping: the peer
  // that runs next on this core is often the one to publish.
  static constexpr std::chrono::nanoseconds kPollOnly{2000};
  static constexpr int kYields = 16;
  // A yield shorter than kQuickYield ran nobody else; while they are, wait()
  // goes on yielding up to kAloneSpin before it sleeps.
  static constexpr std::chrono::nanoseconds kQuickYield{5000};
  static constexpr std::chrono::nanoseconds kAloneSpin{200'000};
  // Looks poll() takes while spinning: ~1 us at 22 ns per pause (AMD EPYC;
  // longer where a pause is slower), counted as kPolledFirst of kPollOnly.
  static constexpr int kPollLooks = 48;
  static constexpr std::chrono::nanoseconds kPolledFirst{1000};

  std::vector<Rank> ranks_;
  std::size_t ring_capacity_;
  std::chrono::nanoseconds spin_;
};

}  // namespace braid::comm::shm
