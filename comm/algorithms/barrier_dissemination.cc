// Dissemination barrier: in round k rank r signals rank (r + 2^k) mod N and
// waits for rank (r - 2^k) mod N, with header-only messages. After
// ceil(log2 N) rounds every rank has transitively heard from every other, so
// no rank leaves before all have entered.
#include "comm/algorithms/algorithms.h"

namespace braid::comm {

void barrier_dissemination(Exchange& x) {
  const int n = x.size(), r = x.rank();
  for (int k = 0, distance = 1; distance < n; ++k, distance *= 2) {
    Request sent = x.send((r + distance) % n, k, 0, nullptr, 0);
    x.wait(x.recv((r - distance + n) % n, k, 0, nullptr, 0));
    x.wait(sent);
  }
}

}  // namespace braid::comm
