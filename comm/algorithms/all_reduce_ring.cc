// Ring all-reduce = ring reduce-scatter + ring all-gather.
//
// The reduce-scatter leaves chunk r fully reduced on rank r, accumulating in
// the output buffer (so in place and out of place share one path); for avg
// each rank divides its own chunk by N before the all-gather circulates it.
// The two phases overlap: a segment of the own chunk is sent on as soon as
// it is final.
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
  // Each final segment of this rank's chunk starts the all-gather at once,
  // while it is still in cache: the all-gather never re-reads the chunk from
  // memory, which is what bounds large all-reduces.
  const std::uint32_t ag_first_step = static_cast<std::uint32_t>(x.size() - 1);
  const int right = (x.rank() + 1) % x.size();
  reduce_scatter_ring(x, static_cast<const std::byte*>(op.send), out, layout, false,
                      [&](std::size_t g, std::byte* data, std::size_t count) {
                        if (op.reduce_op == ReduceOp::avg) kernels::cpu::divide(data, count, op.dtype, x.size());
                        x.send(right, ag_first_step, g, data, count * es);
                      });
  all_gather_ring(x, out, layout, ag_first_step, true);
}

}  // namespace braid::comm
