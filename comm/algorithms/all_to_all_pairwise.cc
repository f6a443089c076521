// Pairwise all-to-all.
//
// In step s (1 .. N-1) rank r sends its block for rank (r+s) mod N and
// receives the block of rank (r-s) mod N, so every step is a permutation and
// no rank is the target of two senders at once. All steps are posted up
// front and complete as the transports drain them. In place, the input is
// first copied to scratch so that arriving blocks cannot overwrite blocks
// still to be sent.
#include <cstring>
#include <vector>

#include "comm/algorithms/algorithms.h"

namespace braid::comm {

void all_to_all_pairwise(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size(), r = x.rank();
  const std::size_t block = op.count * x.element_bytes();
  auto* out = static_cast<std::byte*>(op.recv);
  auto* src = static_cast<const std::byte*>(op.send);
  if (src == out && n > 1) {
    std::byte* copy = x.scratch(block * n);
    std::memcpy(copy, src, block * n);
    src = copy;
  }
  if (src != out) std::memcpy(out + r * block, src + r * block, block);
  std::vector<Request> receives;
  for (int s = 1; s < n; ++s) {
    int to = (r + s) % n, from = (r - s + n) % n;
    x.send(to, 0, 0, src + to * block, block);
    receives.push_back(x.recv(from, 0, 0, out + from * block, block));
  }
  for (const Request& request : receives) x.wait(request);
  x.wait_sends();
}

}  // namespace braid::comm
