// What the one-shot collectives share: the shared slots of a communicator
// whose ranks all run on one host (Exchange::share_slots / share_root_slot; the shm
// transport's SharedSlots underneath).
//
// A one-shot collective is one step (the broadcast's differs: below):
// every rank writes its call's signature and its contribution (if any) into
// its slot for this call and publishes it, waits until every peer has
// published this call, checks every peer's signature, and only then
// computes its output straight from the peers' slots (all_reduce: reduces
// them all, in rank order, so that every rank gets bit-identical results).
// No rank writes a user buffer before it has seen every rank's call, so the
// step is also the signature agreement (Algorithm::agrees), and a
// collective costs one cache-line hand-off between ranks instead of log2 N
// message round trips.

// Slots are reused (comm/exchange_slots.cc): a rank's entry of call s at
// s + depth (512 here), its large slot (payloads past an entry's 1000 bytes)
// at s + 2. So before a rank publishes call t it must know that every peer
// has entered call t - depth + 1 (t - 1 for a large slot) and so finished
// reading what it rewrites. A collective that returns only once every rank
// has entered it gives that by itself: the one-shot ones that wait for
// every slot, the direct ones that end with a barrier, and every other one,
// which select.cc makes agree through this step (agree_signatures). The
// one-shot broadcast does not wait for every rank (share_root_slot): its
// root returns as soon as it has published, the other ranks once the
// root's slot is there. It leaves early, and a later publish looks at the
// peers' flags, waiting where one lags: in a run of broadcasts a rank runs
// up to depth - 1 calls ahead of the slowest (one for a large payload), so
// the root of small ones on ranks that share cores is rarely held up by a
// peer that is not running, and a peer that runs catches up many calls at
// a time.
//
// That departs from "a mismatch fails every rank in that call before any
// user buffer is written" for broadcast alone: a rank whose broadcast
// matches the root's gets the root's data, right for its own call, even
// when another rank called something else. The mismatched rank fails in
// that call, naming both calls, buffers untouched; the others fail at their
// next call that waits for every rank, or, in a run of broadcasts, at the
// latest when the run ahead ends (the failed rank closed, or the root's
// late check of every signature: exchange_slots.cc), with the mismatch
// named; where no call comes after it, the communicator's end checks it
// and logs the mismatch (check_early_calls_at_end).
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
// once every peer's slot for this call is there and checked. InvalidUsage
// past kMaxOneshotRanks ranks or the slot's capacity (select.cc never asks
// for that).
SlotViews share_slots(Exchange& x, const void* data, std::size_t bytes);

// The one-shot broadcast's step, which leaves early (Exchange::share_root_slot):
// the root (op().root) publishes `bytes` of `data` and returns at once;
// every other rank publishes its signature alone, waits for the root's slot
// only, checks it and returns its payload (the root gets null). A rank whose
// call matches the root's has the root's data, which is right for its own
// call; one whose call differs fails here, naming both calls, and the other
// ranks later (above).
const void* share_root_slot(Exchange& x, const void* data, std::size_t bytes);

// Reduces every rank's payload of `views` (op.count elements each), in rank
// order, into op.recv, so that every rank that reduces gets bit-identical
// results; avg divides by the rank count at the end. Out of place, this
// rank's own payload is read from op.send, the same bytes as its slot's: a
// slot just written may still sit in the store buffer waiting for its line,
// and loads of it that the buffer cannot forward wait with it.
void reduce_slots(SlotViews views, int rank, int size, const Op& op);

// The signature agreement of every other collective on a communicator with
// shared slots (agree_signatures): the step above with no payload.
void agree_through_slots(Exchange& x);

}  // namespace braid::comm
