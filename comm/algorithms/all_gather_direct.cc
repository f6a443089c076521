// Direct all-gather (direct.h).
//
// Every output holds N blocks of `count` elements; block r is rank r's
// input. Rank r copies its input into block r of every rank's output, its
// own first, in one step (one kernel writing N destinations on a GPU): its
// input is read once and each output byte written once, by the rank whose
// block it is. In place (the input is block r of the rank's own output) the
// rank's own block is left as it is and only the peers' are written. With
// one worker (direct.h) rank 0 does these steps for every r.
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/direct.h"

namespace braid::comm {

void all_gather_direct(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size();
  const DirectBuffers b = open_direct(x);
  for (int share : b.shares) {
    const std::size_t at = static_cast<std::size_t>(share) * op.count * x.element_bytes();
    std::vector<void*> dsts;
    for (int p : this_rank_first(share, n)) dsts.push_back(b.recv[p] + at);
    direct_step(x, dsts, {b.send[share]}, op.count, false);
  }
  close_direct(x, b);
}

}  // namespace braid::comm
