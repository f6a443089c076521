#include "comm/transport/shm/slots.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "comm/wire.h"
#include "runtime/errors.h"

namespace braid::comm::shm {
namespace {

inline void cpu_relax() { __builtin_ia32_pause(); }

constexpr auto kSleepSlice = std::chrono::milliseconds(50);  // a dead peer is noticed within one

std::string rank_text(int rank) { return "rank " + std::to_string(rank); }

std::vector<SharedSlots::Rank> slot_ranks(const std::vector<ShmSlots::Rank>& ranks) {
  std::vector<SharedSlots::Rank> slots(ranks.size());
  for (std::size_t r = 0; r < ranks.size(); ++r)
    if (std::byte* area = ranks[r].segment ? ranks[r].segment + sizeof(SegmentHeader) : nullptr)
      slots[r] = {area, area + kSlotDepth * kEntryStride};
  return slots;
}

constexpr SharedSlots::Layout kLayout{kSlotDepth, kEntryStride, kLargeSlots, kLargeSlotBytes, kLargeStride};

}  // namespace

ShmSlots::ShmSlots(int rank, std::vector<Rank> ranks, std::size_t ring_capacity, std::chrono::nanoseconds spin)
    : SharedSlots(rank, slot_ranks(ranks), kLayout, &reinterpret_cast<SegmentHeader*>(ranks[rank].segment)->sleepers,
                  &reinterpret_cast<SegmentHeader*>(ranks[rank].segment)->peers_closed,
                  spin.count() > 0 ? kPollLooks : 1),
      ranks_(std::move(ranks)), ring_capacity_(ring_capacity), spin_(spin) {}

void ShmSlots::find_closed(std::uint64_t seq) const {
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r)
    if (r != rank_ && header(r)->closed.load(std::memory_order_acquire) &&
        flag(r, seq).load(std::memory_order_acquire) < seq)
      check_alive(r);
}

// A sleeper waiting for a later call of this rank's is left asleep: with
// ranks far apart (a broadcast's root waits for its laggards to come half
// the ring closer) every publish would otherwise wake it, for nothing.
void ShmSlots::wake_sleepers(std::uint64_t published) {
  const std::atomic<std::uint64_t>* awaiting = awaiting_in(rank_);
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    const std::uint64_t seq = awaiting[r].load(std::memory_order_relaxed);
    if (seq == 0 || seq > published || r == rank_) continue;
    SegmentHeader* h = header(r);
    h->doorbell.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(h->doorbell);
  }
}

// While the ranks have cores of their own (spin_ > 0), polls: a peer that
// runs on another core publishes within a microsecond or two. Past
// kPollOnly it yields between looks, since on a busy machine the scheduler
// may have put the peer on this very core, where polling would only keep it
// waiting (measured: 2 ranks on 2 busy cores took 30 us per call polling
// for 20 us, 3 us yielding). Oversubscribed (spin_ == 0) it only yields, a
// few times. Then it sleeps.
bool ShmSlots::wait(int peer, std::uint64_t seq, Clock::time_point deadline) {
  const auto& f = flag(peer, seq);
  if (f.load(std::memory_order_acquire) >= seq) return true;
  const auto start = Clock::now();
  // poll() has just spent about kPolledFirst of the polling.
  const auto poll_end = start + std::min<std::chrono::nanoseconds>(spin_, kPollOnly) - kPolledFirst;
  const auto spin_end = start + spin_;
  while (Clock::now() < poll_end) {
    for (int i = 0; i < 16; ++i) {
      cpu_relax();
      if (f.load(std::memory_order_acquire) >= seq) return true;
    }
  }
  // A yield that comes back at once found nobody else wanting this core:
  // waiting here then costs nobody anything, while sleeping would make the
  // peer pay a futex wake per publish (a rank alone on a core waiting for
  // one that shares the other: 4 ranks placed 3+1, 8-byte broadcast, a
  // sleep and a wake-up for most calls). So it sleeps only once its yields
  // hand the core to others, or after kAloneSpin.
  const auto alone_end = start + kAloneSpin;
  bool alone = true;
  for (int yields = 0; yields < kYields || alone || Clock::now() < spin_end; ++yields) {
    const auto before = Clock::now();
    sched_yield();
    if (f.load(std::memory_order_acquire) >= seq) return true;
    const auto after = Clock::now();
    alone = after - before < kQuickYield && after < alone_end;
  }
  check_stray(peer, seq);
  return sleep(peer, seq, deadline);
}

// Sleeps on this rank's doorbell in slices, looking after each at whether
// the peer is still there to publish. What it waits for goes into the
// peer's memory first (its word there, then the peer's count of sleepers,
// whose seq_cst increment publishes the word), before its last look at the
// flag: a publish that finds no sleeper came before that look, and one that
// finds this rank waiting for a call it has published rings its doorbell.
// `sleeping` stays set throughout, so that a message in its channels, or a
// peer that closes, wakes it too (transport.cc).
bool ShmSlots::sleep(int peer, std::uint64_t seq, Clock::time_point deadline) {
  wake_waiters();
  SegmentHeader* me = header(rank_);
  SegmentHeader* them = header(peer);
  std::atomic<std::uint64_t>& awaiting = awaiting_in(peer)[rank_];
  const auto& f = flag(peer, seq);
  awaiting.store(seq, std::memory_order_relaxed);
  them->sleepers.fetch_add(1, std::memory_order_seq_cst);
  me->sleeping.store(1, std::memory_order_seq_cst);
  struct Awake {
    SegmentHeader* me;
    SegmentHeader* them;
    std::atomic<std::uint64_t>& awaiting;
    ~Awake() {
      me->sleeping.store(0, std::memory_order_relaxed);
      awaiting.store(0, std::memory_order_relaxed);
      them->sleepers.fetch_sub(1, std::memory_order_release);
    }
  } awake{me, them, awaiting};
  for (;;) {
    const std::uint32_t seen = me->doorbell.load(std::memory_order_seq_cst);
    if (f.load(std::memory_order_seq_cst) >= seq) return true;
    const auto now = Clock::now();
    if (now >= deadline || cancelled()) return false;
    futex_wait(me->doorbell, seen, std::min<Clock::duration>(deadline - now, kSleepSlice));
    if (f.load(std::memory_order_acquire) >= seq) return true;
    check_alive(peer, &f, seq);
    check_stray(peer, seq);
  }
}

void ShmSlots::check_alive(int peer, const std::atomic<std::uint64_t>* awaited, std::uint64_t seq) const {
  const bool exited = has_exited(ranks_[peer].pidfd);
  if (!exited && !header(peer)->closed.load(std::memory_order_acquire)) return;
  // It may have published the call awaited and then gone, after the
  // caller's last look: its close (or exit) comes after its publish.
  if (awaited && awaited->load(std::memory_order_acquire) >= seq) return;
  const std::string me = rank_text(rank_), them = rank_text(peer);
  if (std::string why = farewell_of(*header(peer)); !why.empty()) throw farewell_error(peer, rank_, why);
  if (exited)
    throw RemoteError(me + " was waiting for " + them + "'s shared slot (pid " +
                          std::to_string(header(peer)->owner_pid) + "), but " + them + " exited or was killed",
                      peer);
  throw RemoteError(me + " was waiting for " + them + "'s shared slot, but " + them +
                        " closed its communicator (it failed or finished)",
                    peer);
}

// Between calls every ring is drained (each call receives every message
// sent to it, and a collective runs only once the calls before it are
// done), so unread bytes from `peer` while it has not published call `seq`
// are that call's messages, or a send of the peer's that no receive of
// this rank came to take: a send where this rank called the collective
// (torch's alltoall_base with split sizes on one rank, none on the other),
// or one never received. Either is a mismatch, which waited until
// BRAID_TIMEOUT and then blamed the peer's heartbeat. A collective's
// message counts only if it is of this very call (point-to-point ones are
// numbered on their own), and either only while the flag, read after it,
// is still not there.
void ShmSlots::check_stray(int peer, std::uint64_t seq) const {
  const Rank& from = ranks_[peer];
  if (!from.in) return;
  const std::uint64_t tail = from.in->tail.load(std::memory_order_acquire);
  if (from.in->head.load(std::memory_order_acquire) - tail < sizeof(WireHeader)) return;
  WireHeader h;
  std::memcpy(&h, from.in_ring + (tail & (ring_capacity_ - 1)), sizeof h);
  const auto kind = static_cast<OpKind>(h.kind);
  const bool point_to_point = kind == OpKind::send || kind == OpKind::recv;
  if (h.magic != kWireMagic || (h.seq != seq && !point_to_point)) return;
  // A peer that agreed through the slots publishes before it sends this
  // call's first message, or any message of a later call, and stores
  // become visible in order: read after the message, its flag shows
  // whether it did.
  if (flag(peer, seq).load(std::memory_order_acquire) >= seq) return;
  if (point_to_point) {
    // A peer rewriting an entry of a later call (begin() zeroes its flag
    // until it publishes) has published the call before that one: a peer
    // ahead shows in some flag at or past `seq` (found by a review helper).
    for (std::uint64_t s = seq; s < seq + depth(); ++s)
      if (flag(peer, s).load(std::memory_order_acquire) >= seq) return;
    throw RemoteError("mismatched calls: " + rank_text(rank_) + " waits for " + rank_text(peer) +
                          "'s shared slot of this collective, but " + rank_text(peer) + " has not entered it and "
                          "sent " + rank_text(rank_) + " a message (a send of " + std::to_string(h.count) + " " +
                          std::string(name(static_cast<DataType>(h.dtype))) + ") that no receive took: where one rank calls "
                          "send, its peer must call recv, and every rank must issue the same calls in the same "
                          "order",
                      peer);
  }
  Op theirs;
  theirs.kind = kind;
  theirs.dtype = static_cast<DataType>(h.dtype);
  theirs.reduce_op = static_cast<ReduceOp>(h.reduce_op);
  theirs.count = h.count;
  theirs.root = h.root;
  theirs.seq = h.seq;
  throw RemoteError("mismatched collectives: " + rank_text(rank_) + " waits for " + rank_text(peer) +
                        "'s shared slot of this call, but " + rank_text(peer) + " called " + describe(theirs) +
                        " and runs it with " + algorithm_name(h.algorithm) + " (it sent a message of step " +
                        std::to_string(h.step) + "): the arguments, BRAID_ALGO or the registered buffers of the "
                        "ranks differ; every rank must issue the same collectives in the same order, with the same "
                        "BRAID_ALGO, and give every rank registered buffers (Communicator::allocate) or none, counting "
                        "every buffer a rank passes (a send buffer of a broadcast on the ranks other than the root too)" +
                        list_form_note(kind),
                    peer);
}

}  // namespace braid::comm::shm
