// Binomial-tree broadcast, for small messages where latency dominates.
//
// Ranks are numbered relative to the root (v = rank - root mod N). A rank
// receives the whole message once, from the rank that differs from it in its
// lowest set bit, then forwards it to v + 2^k for every 2^k below that bit,
// largest first. Every rank has the message after ceil(log2 N) message
// latencies, against N-1 for the chain.
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace braid::comm {

void broadcast_binomial(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size(), v = (x.rank() - op.root + n) % n;
  const std::size_t bytes = op.count * x.element_bytes();
  auto* out = static_cast<std::byte*>(op.recv);
  auto real = [&](int relative) { return (relative + op.root) % n; };
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      x.wait(x.recv(real(v - mask), 0, 0, out, bytes));
      break;
    }
    mask <<= 1;
  }
  if (v == 0 && op.send != op.recv) std::memcpy(out, op.send, bytes);
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < n) x.send(real(v + mask), 0, 0, out, bytes);
  x.wait_sends();
}

}  // namespace braid::comm
