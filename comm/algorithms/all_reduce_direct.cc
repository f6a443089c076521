// Direct all-reduce (direct.h): no transport ring, each rank reduces its own
// chunk of every rank's input straight into that chunk of every rank's
// output.
//
// The message is cut into N chunks (ChunkLayout). Chunk r is rank r's share
// (or rank 0's, with one worker: direct.h). Rank r reads chunk r of
// all N inputs, reduces them (its own input first) and writes the result to
// chunk r of all N outputs in one fused step: on the host block by block,
// so each block stays in L1/L2 between the reduction and the copies out; on
// a GPU one kernel over the chunk. Each byte is read once and written once:
// half the memory traffic of the ring over shared-memory rings, and the
// least an all-reduce can make. Chunk r is read and written by rank r
// alone, so in place is safe: every input element is read before the
// output element that is its own buffer is written.
//
// Used for registered host buffers of one host from
// kDirectAllReduceMinBytes, and for device buffers that every peer maps
// through CUDA IPC (select.cc).
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/direct.h"

namespace braid::comm {

void all_reduce_direct(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size();
  const DirectBuffers b = open_direct(x);
  const ChunkLayout layout{op.count, n};
  for (int share : b.shares) {
    const std::size_t at = layout.offset(share) * x.element_bytes();
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    for (int p : this_rank_first(share, n)) {
      srcs.push_back(b.send[p] + at);
      dsts.push_back(b.recv[p] + at);
    }
    direct_step(x, dsts, srcs, layout.count_of(share), true);
  }
  close_direct(x, b);
}

}  // namespace braid::comm
