// Point-to-point send and receive: one message, straight from the sender's
// buffer into the receiver's (segmented so large messages stream over every
// socket to the peer).
#include <algorithm>

#include "comm/algorithms/algorithms.h"

namespace braid::comm {

void send_direct(Exchange& x) {
  const Op& op = x.op();
  const std::size_t es = x.element_bytes(), seg = segment_count(x);
  auto* src = static_cast<const std::byte*>(op.send);
  for (std::size_t off = 0, g = 0; off < op.count; off += seg, ++g)
    x.send(op.root, 0, g, src + off * es, std::min(seg, op.count - off) * es);
  x.wait_sends();
}

void recv_direct(Exchange& x) {
  const Op& op = x.op();
  const std::size_t es = x.element_bytes(), seg = segment_count(x);
  auto* out = static_cast<std::byte*>(op.recv);
  std::vector<Request> receives;
  for (std::size_t off = 0, g = 0; off < op.count; off += seg, ++g)
    receives.push_back(x.recv(op.root, 0, g, out + off * es, std::min(seg, op.count - off) * es));
  for (const Request& request : receives) x.wait(request);
}

}  // namespace braid::comm
