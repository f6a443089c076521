// Pipelined reduce along a chain ending at the root.
//
// The chain runs root+1, root+2, ..., root-1, root. The first rank sends its
// input segment by segment; every later rank receives a segment of partial
// sums, reduces its own input into it straight out of transport memory and
// passes it on, so the root receives fully reduced segments while the chain
// is still working on later ones. Non-root ranks keep partial sums in
// scratch; their output buffer is not touched.
#include <algorithm>
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
  std::byte* acc = is_root ? static_cast<std::byte*>(op.recv) : x.scratch(op.count * es);
  if (n == 1) {
    if (op.send != op.recv) std::memcpy(acc, src, op.count * es);
  } else if (position == 0) {
    for (std::size_t g = 0; g < segments; ++g) x.send(next, 0, g, src + g * seg * es, bytes_of(g));
  } else {
    for (std::size_t g = 0; g < segments; ++g) {
      Request in = x.recv_view(prev, 0, g, bytes_of(g));
      x.wait(in);
      std::byte* out = acc + g * seg * es;
      kernels::cpu::reduce(out, src + g * seg * es, x.view(in).data(), bytes_of(g) / es, op.dtype,
                           op.reduce_op);
      x.release(in);
      if (!is_root) x.send(next, 0, g, out, bytes_of(g));
    }
  }
  x.wait_sends();
  if (is_root && op.reduce_op == ReduceOp::avg) kernels::cpu::divide(acc, op.count, op.dtype, n);
}

}  // namespace braid::comm
