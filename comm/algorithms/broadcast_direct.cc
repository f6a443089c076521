// Direct broadcast (direct.h).
//
// Every rank copies the root's input straight into its own output: the
// root's buffer is read N times, once by each rank and all at once, and
// each output byte is written once, by its own rank. No chain, no tree, no
// segments: the copy engines or memory controllers of all ranks work in
// parallel. The root copies its input into its own output too (nothing to
// do in place). With one worker (direct.h) rank 0 makes every rank's copy.
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/direct.h"

namespace braid::comm {

void broadcast_direct(Exchange& x) {
  const Op& op = x.op();
  const DirectBuffers b = open_direct(x);
  for (int share : b.shares) direct_step(x, {b.recv[share]}, {b.send[op.root]}, op.count, false);
  close_direct(x, b);
}

}  // namespace braid::comm
