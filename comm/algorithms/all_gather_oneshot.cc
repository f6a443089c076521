// One-shot all-gather through the shared slots (oneshot.h): every rank
// publishes its block, waits for every peer's and checks their signatures,
// then copies each rank's block out of its slot to its place in the output
// (in place, this rank's own block is already there).
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/oneshot.h"

namespace braid::comm {

void all_gather_oneshot(Exchange& x) {
  const Op& op = x.op();
  const std::size_t bytes = op.count * x.element_bytes();
  const SlotViews views = share_slots(x, op.send, bytes);
  auto* out = static_cast<std::byte*>(op.recv);
  for (int r = 0; r < x.size() && bytes > 0; ++r) {
    const void* from = r == x.rank() ? op.send : views.at[r];
    void* to = op.recv_chunks ? op.recv_chunks[r] : out + r * bytes;  // the list form's buffer r
    if (to != from) std::memcpy(to, from, bytes);
  }
}

}  // namespace braid::comm
