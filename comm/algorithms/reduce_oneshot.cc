// One-shot reduce through the shared slots (oneshot.h): every rank
// publishes its vector and waits for every peer's (the wait is the
// signature agreement, so non-roots wait too); the root reduces all N, in
// rank order, out of the slots into its output.
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/oneshot.h"

namespace braid::comm {

void reduce_oneshot(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size();
  const SlotViews views = share_slots(x, op.send, op.count * x.element_bytes());
  if (x.rank() != op.root || op.count == 0) return;
  reduce_slots(views, x.rank(), n, op);
}

}  // namespace braid::comm
