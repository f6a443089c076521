// Ring reduce-scatter.
//
// The message is cut into N chunks, chunk c owned by rank c. At step s
// (0 .. N-2) rank r sends chunk (r-s-1) mod N to its right neighbour and
// receives chunk (r-s-2) mod N from its left one, which it reduces with its
// own contribution; what it reduced at step s it sends at step s+1. After
// N-1 steps chunk r has passed through every rank and holds the full
// reduction. Each chunk travels in segments: as soon as a segment is reduced
// it is sent on, so sending segment k overlaps receiving and reducing k+1,
// and received segments are reduced straight out of transport memory
// (recv_view) with no extra copy. A caller can act on each final segment of
// its own chunk while it is still in cache (all_reduce_ring starts its
// all-gather there).
//
// Per rank this sends (N-1)/N of the message: the bandwidth optimum.
#include <algorithm>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "kernels/cpu/reduce.h"

namespace braid::comm {

std::size_t segment_count(const Exchange& x) {
  return std::max<std::size_t>(1, x.tuning().segment_bytes / x.element_bytes());
}

namespace {

// Step 0: this rank's own contribution to its right neighbour's chunk.
void post_first_step(Exchange& x, const std::byte* src, const ChunkLayout& layout, std::uint32_t first_step,
                     std::vector<Request>* sent) {
  const int n = x.size(), right = (x.rank() + 1) % n, first = (x.rank() - 1 + n) % n;
  const std::size_t es = x.element_bytes(), seg = segment_count(x);
  for (std::size_t off = 0, g = 0; off < layout.count_of(first); off += seg, ++g) {
    Request request = x.send(right, first_step, g, src + (layout.offset(first) + off) * es,
                             std::min(seg, layout.count_of(first) - off) * es);
    if (sent) sent->push_back(request);
  }
}

}  // namespace

void reduce_scatter_ring_start(Exchange& x, const std::byte* src, const ChunkLayout& layout,
                               std::uint32_t first_step) {
  post_first_step(x, src, layout, first_step, nullptr);
}

void reduce_scatter_ring(Exchange& x, const std::byte* src, std::byte* dst, const ChunkLayout& layout,
                         bool final_only, const OnFinalSegment& on_final, std::uint32_t first_step,
                         bool first_sent, FinalStaging* staging) {
  const int n = x.size(), r = x.rank();
  const int left = (r - 1 + n) % n, right = (r + 1) % n;
  const std::size_t es = x.element_bytes(), seg = segment_count(x);
  const Op& op = x.op();
  auto chunk_at = [&](int s, int offset) { return ((r - s - offset) % n + 2 * n) % n; };
  // Partial sums live in dst, or in two alternating scratch slots when dst only
  // has room for the final chunk; a slot is rewritten two steps after it was
  // sent, so its sends are waited for first.
  std::size_t slot_bytes = layout.count_of(0) * es;
  std::byte* slots = final_only ? x.scratch(2 * slot_bytes) : nullptr;
  if (!on_final || (staging && staging->slot_bytes < seg * es)) staging = nullptr;
  auto acc = [&](int s, int chunk) -> std::byte* {
    if (s == n - 2 || !final_only) return final_only ? dst : dst + layout.offset(chunk) * es;
    return slots + (s % 2) * slot_bytes;
  };
  // Only this schedule's own sends are waited for: sends the on_final
  // callback posts belong to the caller's next phase.
  std::vector<Request> sent;
  auto wait_sent = [&] {
    for (const Request& request : sent) x.wait(request);
    sent.clear();
  };
  if (!first_sent) post_first_step(x, src, layout, first_step, &sent);
  for (int s = 0; s < n - 1; ++s) {
    if (final_only && s >= 2) wait_sent();
    const int c = chunk_at(s, 2);
    const std::size_t c_count = layout.count_of(c), segments = (c_count + seg - 1) / seg;
    Window ahead(x.tuning().window);
    std::size_t posted = 0;
    for (std::size_t g = 0; g < segments; ++g) {
      for (; posted < segments && !ahead.full(); ++posted)
        ahead.push(x.recv_view(left, first_step + s, posted, std::min(seg, c_count - posted * seg) * es));
      Request in = ahead.pop();
      x.wait(in);
      const std::size_t off = g * seg, n_elems = std::min(seg, c_count - off);
      std::byte* out = acc(s, c) + off * es;
      const std::size_t k = g % FinalStaging::kSlots;
      Request* slot = staging && s == n - 2 ? &staging->sent[k] : nullptr;
      if (slot && (!slot->transport || x.send_done(*slot))) {
        *slot = {};
        out = staging->memory + k * staging->slot_bytes;
      } else {
        slot = nullptr;
      }
      kernels::cpu::reduce(out, src + (layout.offset(c) + off) * es, x.view(in).data(), n_elems,
                           op.dtype, op.reduce_op);
      x.release(in);
      if (s < n - 2) sent.push_back(x.send(right, first_step + s + 1, g, out, n_elems * es));
      else if (on_final) {
        Request reading = on_final(g, out, n_elems);
        if (slot) *slot = reading;
      }
    }
  }
  wait_sent();
}

void reduce_scatter(Exchange& x) {
  const Op& op = x.op();
  const std::size_t es = x.element_bytes(), n = static_cast<std::size_t>(x.size());
  ChunkLayout layout{op.count * n, x.size()};
  auto* src = static_cast<const std::byte*>(op.send);
  auto* out = static_cast<std::byte*>(op.recv);
  if (x.size() == 1) {
    if (out != src) std::copy_n(src, op.count * es, out);
  } else if (out == src + x.rank() * op.count * es) {
    // In place: partial sums may overwrite the caller's input, as NCCL allows.
    reduce_scatter_ring(x, src, const_cast<std::byte*>(src), layout, false);
  } else {
    reduce_scatter_ring(x, src, out, layout, true);
  }
  if (op.reduce_op == ReduceOp::avg) kernels::cpu::divide(out, op.count, op.dtype, x.size());
}

}  // namespace braid::comm
