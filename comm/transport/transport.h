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

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/types.h"
#include "comm/wire.h"
#include "runtime/errors.h"

namespace braid::comm {

using RequestId = std::uint32_t;

// The error a peer's farewell (Transport::farewell) becomes on the rank it
// reached, alike on every transport that carries one.
inline RemoteError farewell_error(int peer, int rank, std::string_view why) {
  return RemoteError("rank " + std::to_string(peer) + " stopped its communicator and told rank " +
                         std::to_string(rank) + " why: " + std::string(why),
                     peer);
}

// What every transport's factory (connect_shm, connect_tcp, open_ibverbs)
// needs of its communicator; setup.cc fills it once and each transport's
// options add their own fields.
struct ConnectOptions {
  int rank = 0;
  int size = 1;
  std::uint32_t comm_id = 0;
  std::string job_token;  // every connection proves it (transport-specific handshake)
  std::string run_id;     // RankInfo's: names shared memory (runtime/shm_names.h)
  std::chrono::nanoseconds spin{};  // how long progress() polls before it sleeps
  std::chrono::milliseconds timeout{300'000};
  // Throws where a rank published that its set-up failed, or its launcher
  // that a rank of the job did (setup.cc); a wait of set-up looks between
  // its slices, giving its own deadline: a store that does not answer by
  // then is not waited for (the look throws nothing for it). Empty: nothing
  // to look at.
  std::function<void(std::chrono::steady_clock::time_point deadline)> check_peers;
  // Publishes why this rank's set-up failed where its peers look for it
  // (setup.cc; bounded): called before a transport closes connections that
  // peers which finished their set-up may already use, since they ask for
  // the reason as they see them close. Empty: nothing to publish to.
  std::function<void(const std::string& why)> announce_failure;
};

// Shared slots: memory that every rank of a communicator on one host can
// read, offered by a transport whose ranks share it (shm). Each rank owns a
// ring of depth() entries, the entry of call s (Op::seq) being s modulo
// depth(), and large_count() large slots, that of call s being s modulo
// large_count(). A rank writes its entry (and, for a payload the entry does
// not hold, a large slot), then publish()es the call's sequence number into
// the entry's flag word (release); a peer reads them once wait() saw that
// number there (acquire). The first bytes of an entry share a cache line
// with the flag, so a small message and its arrival travel as one line. The
// transport moves flags and wakes sleepers; what the slots hold, and the
// rule that keeps a rank from rewriting memory that a peer still reads, are
// their user's protocol (comm/exchange_slots.cc): ranks may run up to
// depth() - 1 calls apart, so wait() and poll() accept a flag at or past the
// number asked for, and published() tells which it was.
//
// The slots are plain memory at one layout in every rank's segment, so
// everything a call does while nobody sleeps (write, publish, poll, read,
// the closed check) is inline here, without a virtual call (issue 18: a
// small one-shot call made eight of them); only waiting past the poll,
// waking sleepers and naming a peer that closed are the transport's.
class SharedSlots {
 public:
  // Bytes at the start of every entry that share the flag's cache line.
  static constexpr std::size_t kLineBytes = 56;

  // Where a rank's slots are and how they are cut: the same on every rank.
  struct Layout {
    std::size_t depth = 0;         // entries per rank, a power of two
    std::size_t entry_stride = 0;  // bytes per entry, its flag word included
    std::size_t large_count = 0;   // large slots per rank
    std::size_t large_bytes = 0;   // payload bytes of each
    std::size_t large_stride = 0;  // bytes from one large slot to the next
  };
  struct Rank {
    std::byte* entries = nullptr;  // its first entry (its flag word)
    std::byte* large = nullptr;    // its first large slot
  };

  virtual ~SharedSlots() = default;
  // Entries per rank, and the bytes of each after its flag word; large
  // slots per rank, and the bytes of each. The same on every rank.
  std::size_t depth() const { return layout_.depth; }
  std::size_t entry_bytes() const { return layout_.entry_stride - sizeof(std::uint64_t); }
  std::size_t large_count() const { return layout_.large_count; }
  std::size_t large_bytes() const { return layout_.large_bytes; }

  // Starts rewriting this rank's entry for call `seq`: its flag stops naming
  // the call it held (a peer that reads that call's entry late sees so by
  // reading the flag again after the content: stores reach other cores in
  // program order), and the entry is returned to fill before publish(seq).
  // mine_large(seq): the large slot of `seq`.
  std::span<std::byte> begin(std::uint64_t seq) {
    flag(rank_, seq).store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    return {entry(rank_, seq) + sizeof(std::uint64_t), entry_bytes()};
  }
  std::span<std::byte> mine_large(std::uint64_t seq) { return {large(rank_, seq), layout_.large_bytes}; }
  // Marks this rank's entry for `seq` complete. Peers that sleep waiting for
  // it are woken by wake_waiters(), or before this rank sleeps in wait():
  // waking needs a full fence and a look at the sleepers, which right here
  // would hold the first wait up by the store's round trip to the peers.
  void publish(std::uint64_t seq) {
    flag(rank_, seq).store(seq, std::memory_order_release);
    published_ = seq;
    wake_pending_ = true;
  }
  // Wakes the peers that sleep waiting for this rank's last published entry,
  // unless that was done; called once every entry this rank waits for is in.
  // The fence orders the flag's store before the look at this rank's count
  // of sleepers, which a sleeper raises before its last look at the flag:
  // either the sleeper sees the flag or this rank sees the sleeper.
  void wake_waiters() {
    if (!wake_pending_) return;
    wake_pending_ = false;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleepers_->load(std::memory_order_acquire) != 0) wake_sleepers(published_);
  }
  // Whether `peer` has published `seq` (or later), after a short poll (about
  // a microsecond) while every local rank has a core, one look otherwise;
  // never reads the clock, so the many waits that end here cost no more
  // than the cache line's hand-off.
  bool poll(int peer, std::uint64_t seq) const {
    const auto& f = flag(peer, seq);
    for (int i = 0;; __builtin_ia32_pause()) {
      if (f.load(std::memory_order_acquire) >= seq) return true;
      if (++i >= poll_looks_) return false;
    }
  }
  // Waits until `peer` has published `seq` (or later): polls while every
  // local rank has a core (ConnectOptions::spin), yields and then sleeps
  // otherwise. False once `deadline` passed; RemoteError naming the peer
  // when it exited or closed its communicator before publishing.
  virtual bool wait(int peer, std::uint64_t seq, Clock::time_point deadline) = 0;
  // `peer`'s entry and large slot for `seq`, to read after wait() returned
  // true, while published() still says `seq`.
  std::span<const std::byte> theirs(int peer, std::uint64_t seq) const {
    return {entry(peer, seq) + sizeof(std::uint64_t), entry_bytes()};
  }
  std::span<const std::byte> theirs_large(int peer, std::uint64_t seq) const {
    return {large(peer, seq), layout_.large_bytes};
  }
  // The sequence number `peer` last published in the entry that `seq` uses
  // (0 while it rewrites it).
  std::uint64_t published(int peer, std::uint64_t seq) const {
    return flag(peer, seq).load(std::memory_order_acquire);
  }
  // The same two for a caller that reads several peers' entries of one
  // call: where the entries of `seq` start in each rank's ring, then each
  // peer's flag word and content from there.
  std::size_t entry_offset(std::uint64_t seq) const { return (seq & (layout_.depth - 1)) * layout_.entry_stride; }
  const std::atomic<std::uint64_t>& flag_at(int peer, std::size_t offset) const {
    return *reinterpret_cast<const std::atomic<std::uint64_t>*>(areas_[peer].entries + offset);
  }
  const std::byte* content_at(int peer, std::size_t offset) const {
    return areas_[peer].entries + offset + sizeof(std::uint64_t);
  }
  // Makes every wait() of this rank return false (as at its deadline)
  // within a sleep's slice, now and from then on: its communicator was
  // aborted (Communicator::abort). Any thread; the caller also wakes a
  // sleeper at once (Transport::interrupt rings the same doorbell).
  void cancel() { cancelled_.store(true, std::memory_order_release); }
  // A RemoteError naming the first peer that closed its communicator (it
  // failed, or finished) without having published `seq`: it never will.
  // One look at a word of this rank's own that a closing peer raises.
  void check_closed(std::uint64_t seq) const {
    if (peers_closed_->load(std::memory_order_acquire) != 0) find_closed(seq);
  }

 protected:
  // `ranks`: every rank's slots, [rank], this one's included. `sleepers`
  // and `peers_closed`: words in this rank's memory that peers raise while
  // they sleep waiting for its slot, and once they closed. `poll_looks`:
  // the looks poll() takes (1: no polling).
  SharedSlots(int rank, std::vector<Rank> ranks, const Layout& layout, const std::atomic<std::uint32_t>* sleepers,
              const std::atomic<std::uint32_t>* peers_closed, int poll_looks)
      : rank_(rank), areas_(std::move(ranks)), layout_(layout), sleepers_(sleepers), peers_closed_(peers_closed),
        poll_looks_(poll_looks) {}
  std::byte* entry(int rank, std::uint64_t seq) const {
    return areas_[rank].entries + entry_offset(seq);
  }
  std::byte* large(int rank, std::uint64_t seq) const {
    return areas_[rank].large + (seq % layout_.large_count) * layout_.large_stride;
  }
  std::atomic<std::uint64_t>& flag(int rank, std::uint64_t seq) const {
    return *reinterpret_cast<std::atomic<std::uint64_t>*>(entry(rank, seq));
  }
  // Wakes the peers that sleep waiting for this rank's entry of `published`
  // (or an earlier one); a sleeper waiting for another rank, or for a later
  // call, stays asleep.
  virtual void wake_sleepers(std::uint64_t published) = 0;
  // check_closed() once some peer closed: the RemoteError, where one that
  // closed has not published `seq`.
  virtual void find_closed(std::uint64_t seq) const = 0;
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  const int rank_;

 private:
  const std::vector<Rank> areas_;
  const Layout layout_;
  const std::atomic<std::uint32_t>* const sleepers_;
  const std::atomic<std::uint32_t>* const peers_closed_;
  const int poll_looks_;
  bool wake_pending_ = false;    // published, sleepers not yet looked for
  std::atomic<bool> cancelled_{false};  // cancel(): from another thread
  std::uint64_t published_ = 0;  // the last call this rank published
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
  // Makes a progress() that sleeps in another thread return soon, or the
  // next one return without sleeping: the only call that may come from
  // any thread (the engine's, when a call is queued that the running one
  // takes in: comm/engine_p2p.cc).
  virtual void interrupt() {}

  // Closes every connection so that peers blocked on this rank fail fast.
  virtual void shutdown() = 0;
  // Before shutdown() of a failed communicator: tells the peers why, where
  // the transport can carry it (best effort, never throws), so that a peer
  // failing on this rank names the reason even when the store that would
  // carry it was this rank's and went with it.
  virtual void farewell(const std::string& /*reason*/) {}

  // Registered memory. find_region: whether [data, data + bytes) lies in
  // memory this rank registered that this transport can hand its peers;
  // fills `ref` if so. map_region: the bytes `ref` names in `peer`'s
  // registered memory as a span here (shm maps the peer's region), after
  // checking them against what the peer really registered: RemoteError
  // when `ref` lies outside it, InvalidUsage from a transport that cannot
  // reach a peer's memory (the defaults).
  virtual bool find_region(const void* data, std::size_t bytes, RegionRef& ref);
  virtual std::span<std::byte> map_region(int peer, const RegionRef& ref);
  // After each direct collective that mapped peers' regions: where the
  // work that reads and writes them is still queued on a device, the
  // stream it is queued on (`queued_on`; null: it is done). A transport
  // that unmaps a region it evicts (cuda_ipc) waits for that work first.
  virtual void regions_used(const Stream* queued_on) { (void)queued_on; }

  // The shared slots of this communicator's ranks (SharedSlots), or null:
  // only a transport that reaches every rank of the communicator through
  // shared memory has them.
  virtual SharedSlots* shared_slots() { return nullptr; }
  // Whether bytes from `peer` have arrived that no receive has taken yet;
  // true where the transport cannot tell.
  virtual bool has_unread(int /*peer*/) { return true; }
  // Why `peer` will not answer any more, where this transport can tell
  // (its process is gone; it closed its side), for a timed-out wait to
  // say of a rank whose heartbeat stood still; empty where it cannot
  // tell. Only looks: never throws, moves nothing.
  virtual std::string gone(int /*peer*/) { return {}; }

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
