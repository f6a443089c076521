// Ring all-gather.
//
// Rank r starts with chunk r. At step s (0 .. N-2) it sends chunk (r-s) mod N
// to its right neighbour and receives chunk (r-s-1) mod N from its left one,
// straight into its place in the output; what arrived at step s is forwarded
// at step s+1, segment by segment, so the ring streams without waiting for
// whole chunks. Receives are posted a window ahead of the one consumed.
// Per rank this sends (N-1)/N of the output.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/algorithms.h"

namespace braid::comm {

void all_gather_ring(Exchange& x, std::byte* buf, const ChunkLayout& layout, std::uint32_t first_step,
                     bool first_sent, Placement last_step) {
  const int n = x.size(), r = x.rank();
  const int left = (r - 1 + n) % n, right = (r + 1) % n;
  const std::size_t es = x.element_bytes(), seg = segment_count(x);
  auto chunk_at = [&](int s) { return ((r - s) % n + n) % n; };
  auto segments_of = [&](int c) { return (layout.count_of(c) + seg - 1) / seg; };
  auto segment_ptr = [&](int c, std::size_t g) { return buf + (layout.offset(c) + g * seg) * es; };
  auto segment_bytes = [&](int c, std::size_t g) {
    return std::min(seg, layout.count_of(c) - g * seg) * es;
  };
  // Only this schedule's own sends are waited for at the end: a caller that
  // posted the first step may have queued its next phase behind it.
  std::vector<Request> sent;
  if (!first_sent)
    for (std::size_t g = 0; g < segments_of(r); ++g)
      sent.push_back(x.send(right, first_step, g, segment_ptr(r, g), segment_bytes(r, g)));
  // Receives go in (step, segment) order; one cursor posts them, a second
  // one, trailing by the window, consumes them.
  struct Position {
    int s = 0;
    std::size_t g = 0;
  };
  auto settle = [&](Position& p) {  // skips steps whose chunk is empty
    for (; p.s < n - 1 && p.g >= segments_of(chunk_at(p.s + 1)); p.g = 0) ++p.s;
  };
  auto advance = [&](Position& p) {
    ++p.g;
    settle(p);
  };
  Position post, take;
  settle(post);
  settle(take);
  Window ahead(x.tuning().window);
  while (take.s < n - 1) {
    for (; post.s < n - 1 && !ahead.full(); advance(post)) {
      int c = chunk_at(post.s + 1);
      ahead.push(x.recv(left, first_step + post.s, post.g, segment_ptr(c, post.g), segment_bytes(c, post.g),
                        post.s == n - 2 ? last_step : Placement::cached));
    }
    x.wait(ahead.pop());
    int c = chunk_at(take.s + 1);
    if (take.s < n - 2)
      sent.push_back(x.send(right, first_step + take.s + 1, take.g, segment_ptr(c, take.g), segment_bytes(c, take.g)));
    advance(take);
  }
  for (const Request& request : sent) x.wait(request);
}

void all_gather(Exchange& x) {
  const Op& op = x.op();
  const std::size_t es = x.element_bytes();
  auto* out = static_cast<std::byte*>(op.recv);
  auto* mine = out + x.rank() * op.count * es;
  if (static_cast<const std::byte*>(op.send) != mine) std::memcpy(mine, op.send, op.count * es);
  if (x.size() > 1) all_gather_ring(x, out, ChunkLayout{op.count * x.size(), x.size()});
}

}  // namespace braid::comm
