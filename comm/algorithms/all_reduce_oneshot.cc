// One-shot all-reduce through the shared slots (oneshot.h), for small
// messages on one host: every rank publishes its vector in its slot, waits
// for every peer's and checks their signatures, then reduces all N vectors,
// in rank order, straight out of the slots into its output. Every rank
// computes the same sums in the same order, so the results are
// bit-identical; in place, the input was copied into the slot before the
// output is written. One cache-line hand-off (data and flag together up to
// 32 bytes) instead of log2 N message round trips; each rank reads N
// vectors, so the ring takes over as messages grow (select.cc).
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/oneshot.h"

namespace braid::comm {

void all_reduce_oneshot(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size();
  const SlotViews views = share_slots(x, op.send, op.count * x.element_bytes());
  if (op.count == 0) return;
  reduce_slots(views, x.rank(), n, op);
}

}  // namespace braid::comm
