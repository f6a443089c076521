// The Exchange's side of the shared slots (transport.h SharedSlots): what a
// slot holds, and the check every reader applies to it.
//
// A slot starts with the writer's call signature, then its payload:
//
//   flag    u64   the call's sequence number, written last (the transport's)
//   header  24 B  count, payload bytes, root, kind, dtype, reduce op, comm id
//   payload       at most slot_capacity() bytes; the first 32 share the
//                 flag's cache line, so an 8-byte all-reduce moves one line
//
// A reader compares the header with its own call as a message receiver
// compares wire headers (comm/wire.h): a peer that called another
// collective, or the same one with other arguments, or that runs the call
// with another algorithm (other payload bytes), fails the reader with a
// RemoteError naming both calls before any byte of the payload is used.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "comm/algorithms/exchange.h"
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
  bool operator==(const SlotHeader&) const = default;
};
static_assert(sizeof(SlotHeader) == 24, "the slot header is part of the shared-memory protocol");

// This rank's call, as it publishes it and expects it of every peer.
SlotHeader signature(const Op& op, std::uint32_t comm_id, std::size_t bytes) {
  return {op.count,
          static_cast<std::uint32_t>(bytes),
          op.root,
          static_cast<std::uint8_t>(op.kind),
          static_cast<std::uint8_t>(op.dtype),
          static_cast<std::uint8_t>(op.reduce_op),
          kSlotMagic,
          comm_id};
}

SharedSlots* slots_of(const ExchangeContext& c) { return c.slots; }

// The wire header that `slot` stands for, so that wire.h's check and its
// messages serve the slots too.
WireHeader as_wire(const SlotHeader& slot, std::uint64_t seq) {
  WireHeader h;
  if (slot.magic != kSlotMagic) h.magic = 0;
  h.kind = slot.kind;
  h.dtype = slot.dtype;
  h.reduce_op = slot.reduce_op;
  h.root = slot.root;
  h.comm_id = slot.comm_id;
  h.seq = seq;
  h.count = slot.count;
  h.payload_bytes = slot.payload_bytes;
  return h;
}

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

std::size_t slot_capacity(const ExchangeContext& context) { return context.slot_payload; }

void find_slots(ExchangeContext& context) {
  context.slots = context.distinct.size() == 1 ? context.distinct.front()->shared_slots() : nullptr;
  context.slot_payload = context.slots ? context.slots->slot_bytes() - sizeof(SlotHeader) : 0;
}

// The payload past the flag's cache line goes first; then the line's whole
// content, composed here, in one burst of stores right before the flag, so
// that a peer polling the flag takes the line once, complete, rather than
// stealing it back between the header, the payload and the flag.
std::span<const std::byte> Exchange::publish_slot(const void* data, std::size_t bytes) {
  SharedSlots* slots = slots_of(c_);
  if (!slots || bytes > c_.slot_payload) throw InvalidUsage(describe(op_) + ": does not fit a shared slot");
  const std::span<std::byte> slot = slots->mine(op_.seq);
  const auto* from = static_cast<const std::byte*>(data);
  const std::size_t head = std::min(bytes, kHeadBytes);
  if (bytes > head) std::memcpy(slot.data() + SharedSlots::kLineBytes, from + head, bytes - head);
  std::byte line[SharedSlots::kLineBytes];  // past the header and `head`, whatever it held: no peer reads it
  const SlotHeader header = signature(op_, c_.comm_id, bytes);
  std::memcpy(line, &header, sizeof header);
  copy_head(line + sizeof header, from, head);
  std::memcpy(slot.data(), line, sizeof line);
  slots->publish(op_.seq);
  return slot.subspan(sizeof(SlotHeader), bytes);
}

void Exchange::slots_arrived() {
  if (SharedSlots* slots = slots_of(c_)) slots->wake_waiters();
}

std::span<const std::byte> Exchange::peer_slot(int peer, std::size_t bytes) {
  SharedSlots* slots = slots_of(c_);
  if (!slots) throw InvalidUsage(describe(op_) + ": no shared slots on this communicator");
  c_.waiting_for.store(peer, std::memory_order_relaxed);
  if (!slots->poll(peer, op_.seq) && !slots->wait(peer, op_.seq, deadline())) timed_out(peer);
  c_.waiting_for.store(-1, std::memory_order_relaxed);
  const std::span<const std::byte> slot = slots->theirs(peer, op_.seq);
  SlotHeader header;
  std::memcpy(&header, slot.data(), sizeof header);
  if (header != signature(op_, c_.comm_id, bytes)) {  // the sentence is built only for a mismatch
    const WireHeader expected = expected_header(c_.comm_id, op_, c_.rank, peer, 0, 0, bytes);
    throw RemoteError(header_mismatch(expected, as_wire(header, op_.seq), c_.rank, peer), peer);
  }
  return slot.subspan(sizeof(SlotHeader), bytes);
}

}  // namespace braid::comm
