// The Exchange's side of the shared slots (transport.h SharedSlots): what a
// slot holds, the check every reader applies to it, and the rule that keeps
// a rank from rewriting a slot that a peer still reads.
//
// A rank's entry of a call starts with its call signature, then its payload
// where it fits:
//
//   flag    u64   the call's sequence number, written last (the transport's)
//   header  24 B  count, payload bytes, root, kind, dtype, reduce op, comm id
//   payload       up to entry_bytes() - 24 bytes (1000); the first 32 share
//                 the flag's cache line, so an 8-byte all-reduce moves one
//                 line. A larger payload, up to slot_capacity(), goes whole
//                 into the call's large slot instead.
//
// A reader compares the header with its own call as a message receiver
// compares wire headers (comm/wire.h): a peer that called another
// collective, or the same one with other arguments, or that runs the call
// with another algorithm (other payload bytes), fails the reader with a
// RemoteError naming both calls before any byte of the payload is used.
//
// Reuse. A rank rewrites its entry of call s at s + depth, and its large
// slot of s at s + large_count (next use at the earliest). Peers read them
// only inside call s, so before a rank writes call t it must know that every
// peer has entered t - depth + 1 (t - large_count + 1 for a large slot), and
// so left every call whose slot it rewrites. It knows that without looking
// where a call since then waited for every peer (all_entered: the one-shot
// calls other than broadcast, every collective that agrees through the
// slots, and the direct ones, which publish nothing and end with a barrier:
// a gap in this rank's published calls). Otherwise, after one-shot
// broadcasts, which leave early, it looks at every peer's flag of that call
// and waits for the missing ones: in a run of broadcasts every rank stays
// within depth - 1 calls of the slowest, and the root of small ones waits
// only when that far ahead.
//
// Early calls are checked late, by their root alone: every other rank of a
// broadcast checked the root's signature before it used a byte, so ranks
// whose calls matched the root's match each other, and one that did not
// failed. What only a root can find is another rank that named itself the
// root: two roots read nobody's slot. So a root compares every peer's
// signature of a broadcast it left early with its own call before it
// publishes its next call that waits for every peer (it would wait for
// them anyway; failing before it publishes, it keeps every peer from
// getting through that call), or at the latest before it rewrites its
// entry of that broadcast. A peer may be rewriting
// its own entry of that call by then; the flag, cleared before the content
// changes (SharedSlots::begin) and read again after it, tells, and such a
// peer was a root of that call too (it checks only then) and checked this
// rank's entry before it started rewriting its own: every pair of ranks
// that both named themselves the root is compared at least once.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>

#include "comm/algorithms/exchange.h"
#include "comm/algorithms/oneshot.h"
#include "comm/transport/transport.h"
#include "comm/wire.h"
#include "runtime/errors.h"

namespace braid::comm {
namespace {

constexpr std::uint8_t kSlotMagic = 0xb5;

struct SlotHeader {
  std::uint64_t count;
  std::uint32_t payload_bytes;
  std::int32_t root;
  std::uint8_t kind, dtype, reduce_op, magic;
  std::uint32_t comm_id;
};
static_assert(sizeof(SlotHeader) == 24, "the slot header is part of the shared-memory protocol");

// This rank's call, as it publishes it and expects it of every peer. The
// kind byte carries the algorithm in its high half (both fit in 4 bits).
static_assert(static_cast<unsigned>(OpKind::recv) < 16 && kAlgorithmIds <= 16);

SlotHeader signature(const Op& op, std::uint32_t comm_id, std::size_t bytes) {
  return {op.count,
          static_cast<std::uint32_t>(bytes),
          op.root,
          static_cast<std::uint8_t>(static_cast<unsigned>(op.kind) | unsigned{op.algorithm} << 4),
          static_cast<std::uint8_t>(op.dtype),
          static_cast<std::uint8_t>(op.reduce_op),
          kSlotMagic,
          comm_id};
}

// The wire header that `slot` stands for, so that wire.h's check and its
// messages serve the slots too.
WireHeader as_wire(const SlotHeader& slot, std::uint64_t seq) {
  WireHeader h;
  if (slot.magic != kSlotMagic) h.magic = 0;
  h.kind = slot.kind & 0xf;
  h.algorithm = slot.kind >> 4;
  h.dtype = slot.dtype;
  h.reduce_op = slot.reduce_op;
  h.root = slot.root;
  h.comm_id = slot.comm_id;
  h.seq = seq;
  h.count = slot.count;
  h.payload_bytes = slot.payload_bytes;
  return h;
}

// A signature as the three little-endian words it occupies in a slot,
// packed in registers. Written from them: a header built on the stack and
// copied from there is read back by wider loads than the stores that wrote
// it, and such a load waits until those stores have left the store buffer,
// behind the slot's own flag store, which waits for the line to come back
// from the peers that read it (measured: three quarters of a small call's
// time in publish_slot). Compared as them: three loads and compares per
// peer, where a field by field comparison cost some forty instructions.
struct SlotWords {
  std::uint64_t w[3];

  explicit SlotWords(const SlotHeader& h)
      : w{h.count, std::uint64_t{h.payload_bytes} | std::uint64_t{static_cast<std::uint32_t>(h.root)} << 32,
          std::uint64_t{h.kind} | std::uint64_t{h.dtype} << 8 | std::uint64_t{h.reduce_op} << 16 |
              std::uint64_t{h.magic} << 24 | std::uint64_t{h.comm_id} << 32} {
    static_assert(std::endian::native == std::endian::little, "the slot words are packed little-endian");
    static_assert(sizeof w == sizeof(SlotHeader) && offsetof(SlotHeader, payload_bytes) == 8 &&
                      offsetof(SlotHeader, root) == 12 && offsetof(SlotHeader, kind) == 16 &&
                      offsetof(SlotHeader, magic) == 19 && offsetof(SlotHeader, comm_id) == 20,
                  "SlotWords follow SlotHeader's layout");
  }
  void store(std::byte* to) const {
    for (int i = 0; i < 3; ++i) std::memcpy(to + 8 * i, &w[i], 8);
  }
  bool matches(const std::byte* from) const {
    std::uint64_t theirs[3];
    std::memcpy(theirs, from, sizeof theirs);
    return ((theirs[0] ^ w[0]) | (theirs[1] ^ w[1]) | (theirs[2] ^ w[2])) == 0;
  }
};

// Payload bytes that share the flag's cache line.
constexpr std::size_t kHeadBytes = SharedSlots::kLineBytes - sizeof(SlotHeader);

// memcpy of at most kHeadBytes, in two overlapping moves of a fixed size
// (inlined stores, not a call), as small calls take it on every publish.
void copy_head(std::byte* to, const std::byte* from, std::size_t bytes) {
  static_assert(kHeadBytes <= 32);
  auto two = [&](auto width) {
    std::memcpy(to, from, width);
    std::memcpy(to + bytes - width, from + bytes - width, width);
  };
  if (bytes >= 16) two(std::integral_constant<std::size_t, 16>());
  else if (bytes >= 8) two(std::integral_constant<std::size_t, 8>());
  else if (bytes >= 4) two(std::integral_constant<std::size_t, 4>());
  else if (bytes > 0) two(std::integral_constant<std::size_t, 1>()), to[bytes / 2] = from[bytes / 2];
}

}  // namespace

// Past kMaxOneshotRanks no one-shot algorithm runs (select.cc), and the
// slots' agreement (agree_through_slots) cannot gather that many views
// either: with slots, every collective of 17 or more ranks on one host
// failed at its agreement ("does not fit the shared slots"). Such a
// communicator agrees through messages, as one across hosts does.
void find_slots(ExchangeContext& context) {
  const bool slots_fit = context.distinct.size() == 1 && context.size <= kMaxOneshotRanks;
  context.slots = slots_fit ? context.distinct.front()->shared_slots() : nullptr;
  context.slot_payload = context.slots ? context.slots->large_bytes() : 0;
  context.slot_depth = context.slots ? context.slots->depth() : 0;
  context.entry_payload = context.slots ? context.slots->entry_bytes() - sizeof(SlotHeader) : 0;
  context.large_count = context.slots ? context.slots->large_count() : 0;
  context.early.assign(context.slot_depth, {});
}

// The peer cannot have published `recv.next_collective` legitimately while
// this rank waits in an earlier receive from it whose message has not all
// arrived (the caller's part): a collective that waits for every rank
// would wait for this one, and its sends before that call were all in the
// ring before its slot (a call starts once the calls before it are done),
// read here after the flag. So with nothing of the peer's unread, it
// entered that collective instead of sending. (The mirror of the shm
// slots' check_stray, which finds a send where a collective waits.) The
// caller must call it only after a look at the rings that moved nothing,
// in the thread that moves them.
void check_receive(const ExchangeContext& c, const Op& recv) {
  const int peer = recv.root;
  if (!c.slots || recv.kind != OpKind::recv || recv.next_collective == 0 || peer < 0 || peer >= c.size) return;
  const std::uint64_t next = recv.next_collective;
  if (c.slots->published(peer, next) < next) return;
  Transport* route = c.routes.at(static_cast<std::size_t>(peer));
  if (route->has_unread(peer)) return;
  SlotHeader header;
  std::memcpy(&header, c.slots->theirs(peer, next).data(), sizeof header);
  const Op call = op_of(as_wire(header, next));
  const bool known = c.slots->published(peer, next) == next && header.magic == kSlotMagic;  // not rewritten meanwhile
  throw RemoteError(
      receive_without_send(c.rank, recv, known ? describe(call) : "collective #" + std::to_string(next)), peer);
}

std::string receive_without_send(int rank, const Op& recv, const std::string& entered) {
  const std::string peer = std::to_string(recv.root);
  return "mismatched calls: rank " + std::to_string(rank) + " waits in " + describe(recv) +
         " for a message from rank " + peer + ", but rank " + peer + " has entered " + entered +
         " without sending it: where one rank calls recv, its peer must call send, and every rank must issue the "
         "same calls in the same order";
}

namespace {

// The RemoteError naming both calls, where `header` (read from `peer`'s
// slot) is not `op`'s signature carrying `bytes`; `late`: the call during
// which an early call's check (check_early_calls) found it. Built only
// for a mismatch.
[[noreturn, gnu::noinline, gnu::cold]] void mismatch(const ExchangeContext& c, const SlotHeader& header, const Op& op,
                                                    int peer, std::size_t bytes, const Op* late = nullptr) {
  const WireHeader expected = expected_header(c.comm_id, op, c.rank, peer, 0, 0, bytes);
  std::string what = header_mismatch(expected, as_wire(header, op.seq), c.rank, peer);
  if (late)
    what += " (found as rank " + std::to_string(c.rank) + " ran " + describe(*late) + ": " + describe(op) +
            " had returned on it before every peer had entered it, as a one-shot broadcast does)";
  throw RemoteError(what, peer);
}

// Throws mismatch() unless the header at `from` is `op`'s signature
// carrying `bytes` (`expected`).
inline void check_signature(const ExchangeContext& c, const std::byte* from, const SlotWords& expected, const Op& op,
                            int peer, std::size_t bytes, const Op* late = nullptr) {
  if (expected.matches(from)) [[likely]] return;
  SlotHeader header;
  std::memcpy(&header, from, sizeof header);
  mismatch(c, header, op, peer, bytes, late);
}

// Copies `peer`'s call header of `seq` (its entry at offset `at`) into
// `header`, its flag saying `seq` before and after: false where the peer
// has not published that call, or is rewriting the entry (top of the file).
inline bool copy_published_header(const SharedSlots& slots, int peer, std::size_t at, std::uint64_t seq,
                                  std::byte* header) {
  const std::atomic<std::uint64_t>& flag = slots.flag_at(peer, at);
  if (flag.load(std::memory_order_acquire) != seq) return false;
  std::memcpy(header, slots.content_at(peer, at), sizeof(SlotHeader));
  std::atomic_thread_fence(std::memory_order_acquire);
  return flag.load(std::memory_order_relaxed) == seq;
}

}  // namespace

std::string check_early_calls_at_end(ExchangeContext& c, Clock::time_point deadline) {
  if (!c.slots || c.oldest_early == 0) return {};
  SharedSlots& slots = *c.slots;
  const std::size_t depth = c.early.size();
  std::string found;
  for (std::uint64_t seq = c.oldest_early; seq <= c.newest_early && found.empty(); ++seq) {
    const Op& early = c.early[seq % depth];
    if (early.seq != seq) continue;
    const SlotWords theirs(signature(early, c.comm_id, 0));
    const std::size_t at = slots.entry_offset(seq);
    for (int peer = 0; peer < c.size && found.empty(); ++peer) {
      if (peer == c.rank) continue;
      try {
        if (!slots.poll(peer, seq) && !slots.wait(peer, seq, deadline)) continue;  // not there yet: nothing said
      } catch (const Error&) {
        continue;  // it closed without reaching the call, which its own error names
      }
      std::byte header[sizeof(SlotHeader)];
      if (!copy_published_header(slots, peer, at, seq, header)) continue;
      try {
        check_signature(c, header, theirs, early, peer, 0);
      } catch (const Error& e) {
        found = e.what();
      }
    }
  }
  c.oldest_early = 0;
  return found;
}

SharedSlots& Exchange::slots() const {
  if (!c_.slots) throw InvalidUsage(describe(op_) + ": no shared slots on this communicator");
  return *c_.slots;
}

void Exchange::share_slots(const void* data, std::size_t bytes, std::span<const void*> views) {
  SharedSlots& slots = this->slots();
  const int n = c_.size, r = c_.rank;
  views[r] = publish_slot(slots, data, bytes, false).data();
  for (int peer = 0; peer < n; ++peer)
    if (peer != r) views[peer] = peer_slot(slots, peer, bytes).data();
  slots.wake_waiters();
  c_.all_entered = op_.seq;
}

const void* Exchange::share_root_slot(const void* data, std::size_t bytes) {
  SharedSlots& slots = this->slots();
  const int root = op_.root;
  const bool is_root = c_.rank == root;
  publish_slot(slots, data, is_root ? bytes : 0, true);
  if (!is_root) {
    // It checked the root's signature.
    const void* payload = peer_slot(slots, root, bytes).data();
    slots.wake_waiters();
    return payload;
  }
  slots.wake_waiters();
  c_.early[op_.seq % c_.early.size()] = op_;
  c_.newest_early = op_.seq;
  if (c_.oldest_early == 0) c_.oldest_early = op_.seq;
  return nullptr;
}

// The payload past the flag's cache line goes first; then the line's
// content, header and first payload bytes, in one burst of stores straight
// from registers right before the flag, so that a peer polling the flag
// takes the line once, complete, rather than stealing it back between the
// header, the payload and the flag.
[[gnu::always_inline]] inline std::span<const std::byte> Exchange::publish_slot(SharedSlots& slots, const void* data,
                                                                                std::size_t bytes, bool early) {
  if (bytes > c_.slot_payload) throw InvalidUsage(describe(op_) + ": does not fit a shared slot");
  const bool in_entry = bytes <= c_.entry_payload;
  make_room(slots, in_entry, early);
  const std::span<std::byte> entry = slots.begin(op_.seq);
  std::byte* payload = in_entry ? entry.data() + sizeof(SlotHeader) : slots.mine_large(op_.seq).data();
  const auto* from = static_cast<const std::byte*>(data);
  const std::size_t head = in_entry ? std::min(bytes, kHeadBytes) : 0;
  if (bytes > head) std::memcpy(payload + head, from + head, bytes - head);
  SlotWords(signature(op_, c_.comm_id, bytes)).store(entry.data());
  copy_head(entry.data() + sizeof(SlotHeader), from, head);
  slots.publish(op_.seq);
  c_.last_published = op_.seq;
  return {payload, bytes};
}

// The reuse rule (top of the file), and the early calls whose entry this
// call rewrites checked first. A call that waits for every peer checks them
// all first (it would wait for those peers anyway): a mismatch of an early
// call then fails this rank before it publishes, so that no peer gets
// through this call either.
[[gnu::always_inline]] inline void Exchange::make_room(SharedSlots& slots, bool in_entry, bool early) {
  const std::uint64_t seq = op_.seq, depth = c_.slot_depth;
  if (seq > c_.last_published + 1) c_.all_entered = std::max(c_.all_entered, seq - 1);
  slots.check_closed(seq);
  const std::uint64_t back = in_entry ? depth - 1 : c_.large_count - 1;
  std::uint64_t needed = seq > back ? seq - back : 0;
  if (!early && c_.oldest_early != 0) needed = std::max(needed, c_.newest_early);
  if (needed > c_.all_entered) {
    // Every call since all_entered was published by every rank (a direct one
    // would have moved all_entered past it), so each peer's flag comes. Once
    // it waits, a rank waits for the laggards to come half the ring closer
    // than it needs, so that far ahead it sleeps once per half ring rather
    // than once per call.
    const std::uint64_t target = std::min(seq - 1, needed + depth / 2);
    for (int peer = 0; peer < c_.size; ++peer)
      if (peer != c_.rank) wait_slot(slots, peer, target);
    c_.all_entered = target;
  }
  if (c_.oldest_early == 0) return;  // nothing to check (every non-root of a broadcast, every other call)
  if (!early) check_early_calls(slots, seq);
  else if (seq >= depth) check_early_calls(slots, seq - depth + 1);
}

// Checks every peer's signature of the calls this rank left early before
// `before`: each peer has entered a later call (all_entered), so has
// published them. A peer that is rewriting its entry, or has, checked this
// rank's first (top of the file). A gap of direct calls costs a look per
// sequence number.
void Exchange::check_early_calls(SharedSlots& slots, std::uint64_t before) {
  const std::size_t depth = c_.early.size();
  for (; c_.oldest_early != 0 && c_.oldest_early < before; ++c_.oldest_early) {
    // The peers' entries of an early call a few on, published hundreds of
    // calls ago: their lines cross now, together, rather than one miss per
    // peer per call when their turn comes (8 ranks bound two per core,
    // 8-byte broadcast: 0.495 -> 0.482 us per call).
    constexpr std::uint64_t kAhead = 8;
    const std::size_t ahead = slots.entry_offset(c_.oldest_early + kAhead);
    for (int peer = 0; peer < c_.size; ++peer)
      if (peer != c_.rank) __builtin_prefetch(&slots.flag_at(peer, ahead));
    Op& early = c_.early[c_.oldest_early % depth];
    const std::uint64_t seq = early.seq;
    if (seq != c_.oldest_early) continue;
    // Only a root leaves early calls to check (share_root_slot), and every
    // other rank published its signature alone.
    const SlotWords theirs(signature(early, c_.comm_id, 0));
    const std::size_t at = slots.entry_offset(seq);
    for (int peer = 0; peer < c_.size; ++peer) {
      if (peer == c_.rank) continue;
      std::byte header[sizeof(SlotHeader)];
      if (copy_published_header(slots, peer, at, seq, header))
        check_signature(c_, header, theirs, early, peer, 0, &op_);
    }
    early.seq = 0;
  }
  if (c_.oldest_early > c_.newest_early) c_.oldest_early = 0;
}

[[gnu::always_inline]] inline void Exchange::wait_slot(SharedSlots& slots, int peer, std::uint64_t seq) {
  c_.waiting_for.store(peer, std::memory_order_relaxed);
  if (!slots.poll(peer, seq) && !slots.wait(peer, seq, deadline())) timed_out(peer);
  c_.waiting_for.store(-1, std::memory_order_relaxed);
}

[[gnu::always_inline]] inline std::span<const std::byte> Exchange::peer_slot(SharedSlots& slots, int peer,
                                                                             std::size_t bytes) {
  wait_slot(slots, peer, op_.seq);
  // A peer rewrites this entry only once this rank has entered a later call.
  if (const std::uint64_t held = slots.published(peer, op_.seq); held != op_.seq)
    throw RemoteError("rank " + std::to_string(c_.rank) + " found rank " + std::to_string(peer) +
                          "'s shared slot of " + describe(op_) + " holding call #" + std::to_string(held) +
                          ": the ranks' slot protocols disagree",
                      peer);
  const std::span<const std::byte> entry = slots.theirs(peer, op_.seq);
  // The payload's lines past the flag's were written before the flag: ask
  // for all of them now, so that they cross from the peer's cache together
  // while the signature is checked, rather than one after another as the
  // reader reaches them (2-rank 128-byte all_reduce: 0.21 -> 0.18 us).
  if (bytes > kHeadBytes && bytes <= c_.entry_payload) {
    const std::byte* end = entry.data() + sizeof(SlotHeader) + bytes;
    for (const std::byte* line = entry.data() - sizeof(std::uint64_t) + 64; line < end; line += 64)
      __builtin_prefetch(line);
  }
  check_signature(c_, entry.data(), SlotWords(signature(op_, c_.comm_id, bytes)), op_, peer, bytes);
  if (bytes <= c_.entry_payload) return entry.subspan(sizeof(SlotHeader), bytes);
  return slots.theirs_large(peer, op_.seq).first(bytes);
}

}  // namespace braid::comm
