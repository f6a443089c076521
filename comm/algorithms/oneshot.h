// What the one-shot collectives share: the shared slots of a communicator
// whose ranks all run on one host (Exchange::my_slot / peer_slot; the shm
// transport's SharedSlots underneath).
//
// A one-shot collective is one step: every rank writes its call's signature
// and its contribution (if any) into its slot for this call and publishes
// it, waits until every peer has published this call, checks every peer's
// signature, and only then computes its output straight from the peers'
// slots (all_reduce: reduces them all, in rank order, so that every rank
// gets bit-identical results). No rank writes a user buffer before it has
// seen every rank's call, so the step is also the signature agreement
// (Algorithm::agrees), and a collective costs one cache-line hand-off
// between ranks instead of log2 N message round trips.
//
// Slots are reused two calls later. That is safe because on a communicator
// with slots no collective returns before every rank has entered it: the
// one-shot ones wait for every slot, the direct ones end with a barrier, and
// select.cc runs every other one's agreement through this step
// (agree_signatures). So a rank enters call s + 2 only after every rank
// entered s + 1, which each did after it finished reading the slots of s.
#pragma once

#include <array>
#include <cstddef>
#include <span>

#include "comm/algorithms/exchange.h"

namespace braid::comm {

// Most ranks a one-shot collective runs on (select.cc): each reads every
// other rank's slot, which pays while the ranks are few.
inline constexpr int kMaxOneshotRanks = 16;

// Every rank's payload for this call, [rank], this rank's own included.
struct SlotViews {
  std::array<const void*, kMaxOneshotRanks> at{};
  std::span<const void* const> all(int size) const { return {at.data(), static_cast<std::size_t>(size)}; }
};

// Copies `bytes` of `data` into this rank's slot, publishes it, and returns
// once every peer's slot for this call is there and checked. `source` >= 0:
// only that rank carries `bytes` (a broadcast's root), every other rank
// publishes its signature alone. InvalidUsage past kMaxOneshotRanks ranks
// or the slot's capacity (select.cc never asks for that).
SlotViews share_slots(Exchange& x, const void* data, std::size_t bytes, int source = -1);

// Reduces every rank's payload of `views` (op.count elements each), in rank
// order, into op.recv, so that every rank that reduces gets bit-identical
// results; avg divides by the rank count at the end.
void reduce_slots(const SlotViews& views, int size, const Op& op);

// The signature agreement of every other collective on a communicator with
// shared slots (agree_signatures): the step above with no payload.
void agree_through_slots(Exchange& x);

}  // namespace braid::comm
