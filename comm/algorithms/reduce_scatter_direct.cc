// Direct reduce-scatter (direct.h).
//
// Every input holds N blocks of `count` elements; block r of the reduction
// is rank r's output. Rank r reads block r of every rank's input, reduces
// them (its own input first) and writes the result into its own output, in
// one step: each byte read once and written once, and every rank reads from
// every other at once. Block r of every input is read by rank r alone, so
// in place (the output is block r of the rank's own input) is safe. With
// one worker (direct.h) rank 0 does this step for every r, block by block.
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/direct.h"

namespace braid::comm {

void reduce_scatter_direct(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size();
  const DirectBuffers b = open_direct(x);
  for (int share : b.shares) {
    const std::size_t at = static_cast<std::size_t>(share) * op.count * x.element_bytes();
    std::vector<const void*> srcs;
    for (int p : this_rank_first(share, n)) srcs.push_back(b.send[p] + at);
    direct_step(x, {b.recv[share]}, srcs, op.count, true);
  }
  close_direct(x, b);
}

}  // namespace braid::comm
