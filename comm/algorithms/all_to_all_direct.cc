// Direct all-to-all (direct.h).
//
// Input and output hold N blocks of `count` elements each; block p of rank
// r's input becomes block r of rank p's output. Rank r pushes: for each p,
// its own first, it copies its input block p into block r of rank p's
// output. Each byte is read once and written once, and each output block
// by the one rank whose data it is. In place this would overwrite a block
// of a peer's input before the peer has read it, so select.cc never runs
// an in-place all-to-all here (the pairwise algorithm copies it aside).
// With one worker (direct.h) rank 0 does these copies for every r.
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/direct.h"

namespace braid::comm {

void all_to_all_direct(Exchange& x) {
  const Op& op = x.op();
  const DirectBuffers b = open_direct(x);
  const std::size_t block = op.count * x.element_bytes();
  for (int share : b.shares)
    for (int p : this_rank_first(share, x.size()))
      direct_step(x, {b.recv[p] + share * block}, {b.send[share] + p * block}, op.count, false);
  close_direct(x, b);
}

}  // namespace braid::comm
