// One-shot broadcast through the shared slots (oneshot.h): the root
// publishes the message in its slot, every other rank its signature alone;
// once every rank's slot is there and checked, each non-root copies the
// message out of the root's slot. Every rank waits for every other (the
// wait is the signature agreement), which costs the root the latency of the
// slowest rank but no more than the agreement round it replaces.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/oneshot.h"

namespace braid::comm {

void broadcast_oneshot(Exchange& x) {
  const Op& op = x.op();
  const std::size_t bytes = op.count * x.element_bytes();
  const SlotViews views = share_slots(x, op.send, bytes, op.root);
  if (bytes == 0) return;
  if (x.rank() != op.root) std::memcpy(op.recv, views.at[op.root], bytes);
  else if (op.send != op.recv) std::memcpy(op.recv, op.send, bytes);
}

}  // namespace braid::comm
