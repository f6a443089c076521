// One-shot broadcast through the shared slots (oneshot.h): the root
// publishes the message in its slot with its call's signature and returns;
// every other rank publishes its signature alone, waits for the root's slot
// only, checks the root's signature and copies the message out of it. So
// the root never waits for the other ranks in this call, and a non-root
// waits for the root alone; in a run of broadcasts ranks drift up to the
// slots' depth apart (exchange_slots.cc), which on ranks that share cores
// (the waiting for each to be scheduled was the call's cost) lets each
// rank run many calls per turn on a core.
//
// Agreement: a non-root that matches the root's call matches every other
// such rank's, so it gets the data right for its call; one that does not
// fails here, buffers untouched, naming both calls. The root and the ranks
// that matched learn of it later (oneshot.h): at their next call that
// waits for every rank, or, in a run of broadcasts, when the failed rank's
// closed communicator or the root's late check of every peer's signature
// is found. An error naming the call or the rank, never a hang and never
// data of another call; the one collective that departs from "a mismatch
// fails every rank in that call".
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/oneshot.h"

namespace braid::comm {

void broadcast_oneshot(Exchange& x) {
  const Op& op = x.op();
  const std::size_t bytes = op.count * x.element_bytes();
  const void* message = share_root_slot(x, op.send, bytes);
  if (bytes == 0) return;
  if (x.rank() != op.root) std::memcpy(op.recv, message, bytes);
  else if (op.send != op.recv) std::memcpy(op.recv, op.send, bytes);
}

}  // namespace braid::comm
