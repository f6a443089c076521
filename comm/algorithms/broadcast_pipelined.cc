// Pipelined broadcast along a chain.
//
// Ranks form a chain starting at the root: root, root+1, ..., root-1. The
// message is cut into segments; every rank but the root receives segment k
// from its predecessor straight into its output and forwards it to its
// successor while segment k+1 is still arriving. For S segments the last
// rank finishes after N-1+S segment times, so large messages approach link
// bandwidth whatever N is.
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace braid::comm {

void broadcast_pipelined(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size(), r = x.rank();
  const std::size_t es = x.element_bytes(), seg = segment_count(x);
  auto* out = static_cast<std::byte*>(op.recv);
  const int position = (r - op.root + n) % n;
  const int prev = (r - 1 + n) % n, next = (r + 1) % n;
  const bool last = position == n - 1;
  const std::size_t segments = (op.count + seg - 1) / seg;
  auto bytes_of = [&](std::size_t g) { return std::min(seg, op.count - g * seg) * es; };
  if (position == 0) {
    if (op.send != op.recv) std::memcpy(out, op.send, op.count * es);
    for (std::size_t g = 0; g < segments && n > 1; ++g) x.send(next, 0, g, out + g * seg * es, bytes_of(g));
    x.wait_sends();
    return;
  }
  Window ahead(x.tuning().window);
  std::size_t posted = 0;
  for (std::size_t g = 0; g < segments; ++g) {
    for (; posted < segments && !ahead.full(); ++posted)
      ahead.push(x.recv(prev, 0, posted, out + posted * seg * es, bytes_of(posted)));
    x.wait(ahead.pop());
    if (!last) x.send(next, 0, g, out + g * seg * es, bytes_of(g));
  }
  x.wait_sends();
}

}  // namespace braid::comm
