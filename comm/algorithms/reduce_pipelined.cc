// Pipelined reduce along a chain ending at the root.
//
// The chain runs root+1, root+2, ..., root-1, root. The first rank sends its
// input segment by segment; every later rank receives a segment of partial
// sums, reduces its own input into it straight out of transport memory and
// passes it on, so the root receives fully reduced segments while the chain
// is still working on later ones. Non-root ranks keep partial sums in a few
// segment-sized slots of scratch, each reused once its send is done; their
// output buffer is not touched. (They held the whole message in scratch,
// twice its size at the peak with the input, for partial sums that live
// only until they are sent on.)
#include <algorithm>
#include <array>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "kernels/cpu/reduce.h"

namespace braid::comm {

void reduce_pipelined(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size(), r = x.rank();
  const std::size_t es = x.element_bytes(), seg = segment_count(x);
  auto* src = static_cast<const std::byte*>(op.send);
  const int position = (r - op.root - 1 + 2 * n) % n;  // root is last
  const int prev = (r - 1 + n) % n, next = (r + 1) % n;
  const bool is_root = r == op.root;
  const std::size_t segments = (op.count + seg - 1) / seg;
  auto bytes_of = [&](std::size_t g) { return std::min(seg, op.count - g * seg) * es; };
  if (n == 1) {
    if (op.send != op.recv) std::memcpy(op.recv, src, op.count * es);
  } else if (position == 0) {
    for (std::size_t g = 0; g < segments; ++g) x.send(next, 0, g, src + g * seg * es, bytes_of(g));
  } else {
    // The root reduces into its output; a rank inside the chain into slot
    // g mod `slots` (the window, 2 to kMaxSlots), whose last send it waits
    // for first. The sends are kept in place: no allocation per call.
    constexpr int kMaxSlots = 16;
    const std::size_t slots =
        is_root ? 0 : std::min<std::size_t>(segments, std::clamp(x.tuning().window, 2, kMaxSlots));
    std::byte* partial = is_root ? nullptr : x.scratch(slots * seg * es);
    std::array<Request, kMaxSlots> sent;
    for (std::size_t g = 0; g < segments; ++g) {
      Request in = x.recv_view(prev, 0, g, bytes_of(g));
      if (!is_root && g >= slots) x.wait(sent[g % slots]);
      x.wait(in);
      std::byte* out = is_root ? static_cast<std::byte*>(op.recv) + g * seg * es : partial + (g % slots) * seg * es;
      kernels::cpu::reduce(out, src + g * seg * es, x.view(in).data(), bytes_of(g) / es, op.dtype,
                           op.reduce_op);
      x.release(in);
      if (is_root) continue;
      sent[g % slots] = x.send(next, 0, g, out, bytes_of(g));
    }
  }
  x.wait_sends();
  if (is_root && op.reduce_op == ReduceOp::avg) kernels::cpu::divide(op.recv, op.count, op.dtype, n, op.avg_scale_up);
}

}  // namespace braid::comm
