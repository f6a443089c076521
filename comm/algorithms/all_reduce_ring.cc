// Ring all-reduce = ring reduce-scatter + ring all-gather.
//
// The reduce-scatter leaves chunk r fully reduced on rank r, accumulating in
// the output buffer (so in place and out of place share one path); for avg
// each rank divides its own chunk by N before the all-gather circulates it.
// Per rank this sends 2(N-1)/N of the message, the bandwidth optimum, and
// suits every message large enough that bandwidth, not latency, dominates.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "kernels/cpu/reduce.h"

namespace braid::comm {

void all_reduce_ring(Exchange& x) {
  const Op& op = x.op();
  const std::size_t es = x.element_bytes();
  auto* out = static_cast<std::byte*>(op.recv);
  ChunkLayout layout{op.count, x.size()};
  if (x.size() == 1) {
    if (op.send != op.recv) std::memcpy(out, op.send, op.count * es);
    return;
  }
  reduce_scatter_ring(x, static_cast<const std::byte*>(op.send), out, layout, false);
  if (op.reduce_op == ReduceOp::avg)
    kernels::cpu::divide(out + layout.offset(x.rank()) * es, layout.count_of(x.rank()), op.dtype, x.size());
  all_gather_ring(x, out, layout);
}

}  // namespace braid::comm
