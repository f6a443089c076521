// Direct reduce (direct.h): the all-reduce's schedule with one output.
//
// Rank r reads chunk r (ChunkLayout over N chunks) of every rank's input,
// reduces them (its own input first) and writes the result into chunk r of
// the root's output; the ranks' chunks together fill it. Each input byte is
// read once, each output byte written once, and the root's link carries no
// more than any other rank's. Chunk r of every buffer is touched by rank r
// alone, so a root reducing in place is safe. With one worker (direct.h)
// rank 0 reduces every chunk, each as its rank would.
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/direct.h"

namespace braid::comm {

void reduce_direct(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size();
  const DirectBuffers b = open_direct(x);
  const ChunkLayout layout{op.count, n};
  for (int share : b.shares) {
    const std::size_t at = layout.offset(share) * x.element_bytes();
    std::vector<const void*> srcs;
    for (int p : this_rank_first(share, n)) srcs.push_back(b.send[p] + at);
    direct_step(x, {b.recv[op.root] + at}, srcs, layout.count_of(share), true);
  }
  close_direct(x, b);
}

}  // namespace braid::comm
