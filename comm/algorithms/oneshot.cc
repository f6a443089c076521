#include "comm/algorithms/oneshot.h"

#include <string>

#include "comm/algorithms/algorithms.h"
#include "runtime/errors.h"

namespace braid::comm {

SlotViews share_slots(Exchange& x, const void* data, std::size_t bytes, int source) {
  const int n = x.size(), r = x.rank();
  if (n > kMaxOneshotRanks || bytes > x.slot_capacity())
    throw InvalidUsage(describe(x.op()) + ": a one-shot collective of " + std::to_string(bytes) + " bytes on " +
                       std::to_string(n) + " ranks does not fit the shared slots");
  SlotViews views;
  views.at[r] = x.publish_slot(data, source < 0 || source == r ? bytes : 0).data();
  for (int peer = 0; peer < n; ++peer)
    if (peer != r) views.at[peer] = x.peer_slot(peer, source < 0 || source == peer ? bytes : 0).data();
  x.slots_arrived();
  return views;
}

// On a communicator with shared slots every collective agrees through them
// (oneshot.h): its signature alone, published and checked against every
// peer's.
void agree_through_slots(Exchange& x) { share_slots(x, nullptr, 0); }

}  // namespace braid::comm
