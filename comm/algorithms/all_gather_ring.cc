// Ring all-gather.
//
// Rank r starts with chunk r. At step s (0 .. N-2) it sends chunk (r-s) mod N
// to its right neighbour and receives chunk (r-s-1) mod N from its left one,
// straight into its place in the output; what arrived at step s is forwarded
// at step s+1. In the verbs of DESIGN.md the schedule is
//
//   send                     step 0: chunk r
//   recv_copy_send x N-2     steps 0 .. N-3: receive a chunk, forward it
//   recv                     step N-2: the last chunk, not forwarded
//
// Every verb works segment by segment, so the ring streams without waiting
// for whole chunks. Receives are posted a window ahead of the one consumed,
// in (step, segment) order across step boundaries, so the next step's first
// segments are already posted while this one's last arrive.
//
// Per rank this sends (N-1)/N of the output.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/algorithms.h"

namespace braid::comm {
namespace {

class AllGatherRing {
 public:
  AllGatherRing(Exchange& x, std::byte* buf, const ChunkLayout& layout, const AllGatherRingOptions& options)
      : x_(x), buf_(buf), layout_(layout), o_(options), n_(x.size()), r_(x.rank()),
        es_(x.element_bytes()), seg_(segment_count(x)), ahead_(x.tuning().window) {
    settle(post_);
  }

  // Step 0: this rank's own chunk.
  void send() {
    for (std::size_t g = 0; g < segments_of(r_); ++g) forward(0, r_, g);
  }
  // Steps 0 .. N-3: each segment lands in its place in buf and goes on at step s+1.
  void recv_copy_send(int s) {
    const int c = chunk_at(s + 1);
    for (std::size_t g = 0; g < segments_of(c); ++g) {
      take();
      forward(s + 1, c, g);
    }
  }
  // Step N-2: each segment lands in its place, as last_step says.
  void recv(int s) {
    for (std::size_t g = 0; g < segments_of(chunk_at(s + 1)); ++g) take();
  }
  // Only this schedule's own sends are waited for: a caller that posted the
  // first step may have queued its next phase behind it.
  void wait_sent() {
    for (const Request& request : sent_) x_.wait(request);
  }

 private:
  // A receive's place in the schedule: the cursor that posts them.
  struct Position {
    int s = 0;
    std::size_t g = 0;
  };

  int chunk_at(int s) const { return ((r_ - s) % n_ + n_) % n_; }
  std::size_t segments_of(int c) const { return (layout_.count_of(c) + seg_ - 1) / seg_; }
  std::byte* segment_ptr(int c, std::size_t g) const {
    if (o_.chunks) return static_cast<std::byte*>(o_.chunks[c]) + g * seg_ * es_;
    return buf_ + (layout_.offset(c) + g * seg_) * es_;
  }
  std::size_t segment_bytes(int c, std::size_t g) const { return std::min(seg_, layout_.count_of(c) - g * seg_) * es_; }

  void settle(Position& p) const {  // skips steps whose chunk is empty
    for (; p.s < n_ - 1 && p.g >= segments_of(chunk_at(p.s + 1)); p.g = 0) ++p.s;
  }
  void forward(int s, int c, std::size_t g) {
    sent_.push_back(x_.send((r_ + 1) % n_, o_.first_step + s, g, segment_ptr(c, g), segment_bytes(c, g)));
  }
  // Posts receives up to the window, then waits for the oldest.
  void take() {
    for (; post_.s < n_ - 1 && !ahead_.full(); ++post_.g, settle(post_)) {
      const int c = chunk_at(post_.s + 1);
      ahead_.push(x_.recv((r_ - 1 + n_) % n_, o_.first_step + post_.s, post_.g, segment_ptr(c, post_.g),
                          segment_bytes(c, post_.g), post_.s == n_ - 2 ? o_.last_step : Placement::cached));
    }
    x_.wait(ahead_.pop());
  }

  Exchange& x_;
  std::byte* buf_;
  const ChunkLayout& layout_;
  const AllGatherRingOptions& o_;
  const int n_, r_;
  const std::size_t es_, seg_;
  Window ahead_;
  Position post_;
  std::vector<Request> sent_;
};

}  // namespace

void all_gather_ring(Exchange& x, std::byte* buf, const ChunkLayout& layout, const AllGatherRingOptions& options) {
  const int n = x.size();
  AllGatherRing ring(x, buf, layout, options);
  if (!options.first_sent) ring.send();
  for (int s = 0; s < n - 2; ++s) ring.recv_copy_send(s);
  if (n > 1) ring.recv(n - 2);
  ring.wait_sent();
}

void all_gather(Exchange& x) {
  const Op& op = x.op();
  const std::size_t es = x.element_bytes();
  auto* out = static_cast<std::byte*>(op.recv);
  AllGatherRingOptions options;
  options.chunks = op.recv_chunks;
  auto* mine = op.recv_chunks ? static_cast<std::byte*>(op.recv_chunks[x.rank()]) : out + x.rank() * op.count * es;
  if (op.count != 0 && static_cast<const std::byte*>(op.send) != mine) std::memcpy(mine, op.send, op.count * es);
  if (x.size() > 1) all_gather_ring(x, out, ChunkLayout{op.count * x.size(), x.size()}, options);
}

}  // namespace braid::comm
