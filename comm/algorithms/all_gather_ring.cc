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
#include <deque>

#include "comm/algorithms/algorithms.h"

namespace braid::comm {

void all_gather_ring(Exchange& x, std::byte* buf, const ChunkLayout& layout, std::uint32_t first_step,
                     bool first_sent) {
  const int n = x.size(), r = x.rank();
  const int left = (r - 1 + n) % n, right = (r + 1) % n;
  const std::size_t es = x.element_bytes(), seg = segment_count(x);
  auto chunk_at = [&](int s) { return ((r - s) % n + n) % n; };
  auto segments_of = [&](int c) { return (layout.count_of(c) + seg - 1) / seg; };
  auto segment_ptr = [&](int c, std::size_t g) { return buf + (layout.offset(c) + g * seg) * es; };
  auto segment_bytes = [&](int c, std::size_t g) {
    return std::min(seg, layout.count_of(c) - g * seg) * es;
  };
  if (!first_sent)
    for (std::size_t g = 0; g < segments_of(r); ++g)
      x.send(right, first_step, g, segment_ptr(r, g), segment_bytes(r, g));
  // Every receive of every step, in order: (step, segment).
  std::deque<std::pair<int, std::size_t>> todo;
  for (int s = 0; s < n - 1; ++s)
    for (std::size_t g = 0; g < segments_of(chunk_at(s + 1)); ++g) todo.emplace_back(s, g);
  std::deque<std::pair<Request, std::pair<int, std::size_t>>> ahead;
  while (!todo.empty() || !ahead.empty()) {
    while (!todo.empty() && ahead.size() < static_cast<std::size_t>(x.tuning().window)) {
      auto [s, g] = todo.front();
      todo.pop_front();
      int c = chunk_at(s + 1);
      ahead.push_back({x.recv(left, first_step + s, g, segment_ptr(c, g), segment_bytes(c, g)), {s, g}});
    }
    auto [request, position] = ahead.front();
    ahead.pop_front();
    x.wait(request);
    auto [s, g] = position;
    int c = chunk_at(s + 1);
    if (s < n - 2) x.send(right, first_step + s + 1, g, segment_ptr(c, g), segment_bytes(c, g));
  }
  x.wait_sends();
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
