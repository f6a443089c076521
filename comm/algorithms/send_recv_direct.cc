// Point-to-point send and receive: one message, straight from the sender's
// buffer into the receiver's (segmented so large messages stream over every
// socket to the peer).
#include <algorithm>

#include "comm/algorithms/algorithms.h"

namespace braid::comm {

std::vector<Request> post_point_to_point(Exchange& x) {
  const Op& op = x.op();
  const std::size_t es = x.element_bytes(), seg = segment_count(x);
  std::vector<Request> requests;
  requests.reserve(op.count / seg + 1);
  // At least one message, empty for a count of 0: its header carries the
  // call, so a send of 0 against a receive of 10 (or the reverse) fails in
  // that call, naming both, instead of leaving one side waiting or a
  // message nobody receives.
  if (op.kind == OpKind::send) {
    auto* src = static_cast<const std::byte*>(op.send);
    for (std::size_t off = 0, g = 0; off < op.count || g == 0; off += seg, ++g)
      requests.push_back(x.send(op.root, 0, g, src ? src + off * es : nullptr, std::min(seg, op.count - off) * es));
  } else {
    auto* out = static_cast<std::byte*>(op.recv);
    for (std::size_t off = 0, g = 0; off < op.count || g == 0; off += seg, ++g)
      requests.push_back(x.recv(op.root, 0, g, out ? out + off * es : nullptr, std::min(seg, op.count - off) * es));
  }
  return requests;
}

void send_direct(Exchange& x) {
  post_point_to_point(x);
  x.wait_sends();
}

void recv_direct(Exchange& x) {
  for (const Request& request : post_point_to_point(x)) x.wait(request);
}

}  // namespace braid::comm
