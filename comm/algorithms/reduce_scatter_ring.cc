// Ring reduce-scatter.
//
// The message is cut into N chunks, chunk c owned by rank c. At step s
// (0 .. N-2) rank r sends chunk (r-s-1) mod N to its right neighbour and
// receives chunk (r-s-2) mod N from its left one, which it reduces with its
// own contribution; what it reduced at step s it sends at step s+1. After
// N-1 steps chunk r has passed through every rank and holds the full
// reduction. In the verbs of DESIGN.md the schedule is
//
//   send                     step 0: this rank's contribution to chunk r-1
//   recv_reduce_send x N-2   steps 0 .. N-3: partial sums travel on
//   recv_reduce_copy_send    step N-2: chunk r becomes final in dst; the
//                            caller's on_final copies it on and sends it
//                            (all_reduce_ring starts its all-gather there)
//
// Each chunk travels in segments: as soon as a segment is reduced it is sent
// on, so sending segment k overlaps receiving and reducing k+1, and received
// segments are reduced straight out of transport memory (recv_view) with no
// extra copy. A caller thus acts on each final segment of its own chunk
// while it is still in cache.
//
// Per rank this sends (N-1)/N of the message: the bandwidth optimum.
//
// The list form (Op::send_chunks) reads chunk c's input from a buffer of
// its own, and keeps its partial sums in scratch (final_only).
//
// An avg of halves whose inputs were left unscaled (Op::avg_inputs_unscaled)
// scales each input element down as it reduces it: this rank's own at every
// step, and at step 0 the left neighbour's too, which it sent as it is; what
// travels after step 0 is a partial sum of scaled values. The bits are those
// of a sum of scaled copies, without the copy's pass over the input.
#include <algorithm>
#include <span>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "kernels/cpu/reduce.h"

namespace braid::comm {

std::size_t segment_count(const Exchange& x) {
  return std::max<std::size_t>(1, x.tuning().segment_bytes / x.element_bytes());
}

namespace {

// This rank's input for chunk c: its place in src, or its own buffer (inputs).
const std::byte* input_of(const std::byte* src, const void* const* inputs, const ChunkLayout& layout, int c,
                          std::size_t es) {
  return inputs ? static_cast<const std::byte*>(inputs[c]) : src + layout.offset(c) * es;
}

// Step 0 (the `send` verb): this rank's own contribution to its right
// neighbour's chunk, straight from src (or inputs).
void send_first_step(Exchange& x, const std::byte* src, const ChunkLayout& layout, std::uint32_t first_step,
                     std::vector<Request>* sent, const void* const* inputs = nullptr) {
  const int n = x.size(), right = (x.rank() + 1) % n, first = (x.rank() - 1 + n) % n;
  const std::size_t es = x.element_bytes(), seg = segment_count(x);
  const std::byte* from = input_of(src, inputs, layout, first, es);
  for (std::size_t off = 0, g = 0; off < layout.count_of(first); off += seg, ++g) {
    Request request = x.send(right, first_step, g, from + off * es, std::min(seg, layout.count_of(first) - off) * es);
    if (sent) sent->push_back(request);
  }
}

// The segments of one step's chunk as they arrive from the left neighbour,
// into transport memory; receives are posted a window ahead of the one
// being consumed.
class StepReceives {
 public:
  StepReceives(Exchange& x, int left, std::uint32_t step, std::size_t count)
      : x_(x), left_(left), step_(step), count_(count), seg_(segment_count(x)), ahead_(x.tuning().window) {}

  std::size_t segments() const { return (count_ + seg_ - 1) / seg_; }
  std::size_t count_of(std::size_t g) const { return std::min(seg_, count_ - g * seg_); }

  // Posts receives up to the window.
  void post_ahead() {
    for (; posted_ < segments() && !ahead_.full(); ++posted_)
      ahead_.push(x_.recv_view(left_, step_, posted_, count_of(posted_) * x_.element_bytes()));
  }
  // Waits for the next segment; its bytes stay readable until release().
  std::span<const std::byte> next() {
    post_ahead();
    current_ = ahead_.pop();
    x_.wait(current_);
    return x_.view(current_);
  }
  void release() { x_.release(current_); }

 private:
  Exchange& x_;
  int left_;
  std::uint32_t step_;
  std::size_t count_, seg_, posted_ = 0;
  Window ahead_;
  Request current_{};
};

class ReduceScatterRing {
 public:
  ReduceScatterRing(Exchange& x, const std::byte* src, std::byte* dst, const ChunkLayout& layout,
                    const ReduceScatterRingOptions& options);

  void send() { send_first_step(x_, src_, layout_, o_.first_step, &sent_, o_.inputs); }
  void recv_reduce_send(int s);
  void recv_reduce_copy_send(int s);
  // Only this schedule's own sends are waited for: sends the on_final
  // callback posts belong to the caller's next phase.
  void wait_sent() {
    for (std::vector<Request>* list : {&sent_, &slot_sent_[0], &slot_sent_[1]}) wait_all(*list);
  }

 private:
  int chunk_at(int s) const { return ((r_ - s - 2) % n_ + 2 * n_) % n_; }  // received at step s
  // Whether `count` elements at dst overlap what step 0 sent from src.
  bool overlaps_first_step(std::size_t count) const {
    const int first = (r_ - 1 + n_) % n_;
    const std::byte* sent = input_of(src_, o_.inputs, layout_, first, es_);
    return dst_ < sent + layout_.count_of(first) * es_ && sent < dst_ + count * es_;
  }
  StepReceives receive(int s);
  std::byte* partial(int s, int chunk);
  Request* free_staging_slot(std::size_t g);
  void reduce(int s, std::byte* out, int chunk, std::size_t g, std::size_t count,
              std::span<const std::byte> received);
  void wait_all(std::vector<Request>& requests) {
    for (const Request& request : requests) x_.wait(request);
    requests.clear();
  }

  Exchange& x_;
  const std::byte* src_;
  std::byte* dst_;
  const ChunkLayout& layout_;
  const ReduceScatterRingOptions& o_;
  const int n_, r_;
  const std::size_t es_, seg_;
  FinalStaging* staging_;
  std::size_t slot_bytes_ = 0;
  std::byte* slots_ = nullptr;
  std::vector<Request> sent_;
  // With final_only, the sends that read scratch slot 0 or 1 (the partial
  // sums of steps 0, 2, ... or 1, 3, ...), apart from the rest.
  std::vector<Request> slot_sent_[2];
};

ReduceScatterRing::ReduceScatterRing(Exchange& x, const std::byte* src, std::byte* dst, const ChunkLayout& layout,
                                     const ReduceScatterRingOptions& options)
    : x_(x), src_(src), dst_(dst), layout_(layout), o_(options), n_(x.size()), r_(x.rank()),
      es_(x.element_bytes()), seg_(segment_count(x)), staging_(options.staging) {
  // Partial sums live in dst, or in two alternating scratch slots when dst
  // only has room for the final chunk (steps before the last: none on 2 ranks).
  slot_bytes_ = layout.count_of(0) * es_;
  if (o_.final_only && n_ > 2) slots_ = x.scratch(2 * slot_bytes_);
  if (!o_.on_final || (staging_ && staging_->slot_bytes < std::min(seg_, layout.count_of(0)) * es_)) staging_ = nullptr;
}

// Starts step s. With final_only, step s reduces into scratch slot s % 2,
// whose partial sums of step s - 2 went out as step s - 1's sends: those
// sends, and only those, are waited for before the slot is rewritten. Not
// the sends of step s - 1 (the other slot): they complete only as the right
// neighbour takes them, which it does only after its own wait at this step,
// so on a transport that cannot hold a whole chunk in flight (shm rings of
// less than a chunk) waiting for them deadlocked every rank at once, from
// 4 ranks on. Not at the last step either, which reduces into dst. The
// step's receives are posted first, so that a transport which writes large
// messages straight into a posted receive (ibverbs) finds them, and the
// left neighbour's sends do not wait on this rank's.
StepReceives ReduceScatterRing::receive(int s) {
  StepReceives in(x_, (r_ - 1 + n_) % n_, o_.first_step + s, layout_.count_of(chunk_at(s)));
  in.post_ahead();
  if (o_.final_only && s >= 2 && s < n_ - 2) wait_all(slot_sent_[s % 2]);
  return in;
}

// Where step s accumulates `chunk`: its place in dst, or a scratch slot.
std::byte* ReduceScatterRing::partial(int s, int chunk) {
  if (s == n_ - 2 || !o_.final_only) return o_.final_only ? dst_ : dst_ + layout_.offset(chunk) * es_;
  return slots_ + (s % 2) * slot_bytes_;
}

// The staging slot for final segment g, cleared for reuse, or null: without
// staging, or while the slot's last send has not gone (the segment then goes
// to dst, so staging never waits on a peer).
Request* ReduceScatterRing::free_staging_slot(std::size_t g) {
  if (!staging_) return nullptr;
  Request& slot = staging_->sent[g % FinalStaging::kSlots];
  if (slot.transport && !x_.send_done(slot)) return nullptr;
  slot = {};
  return &slot;
}

// Step s's reduce of segment g of `chunk`: this rank's input with what it received.
void ReduceScatterRing::reduce(int s, std::byte* out, int chunk, std::size_t g, std::size_t count,
                               std::span<const std::byte> received) {
  const Op& op = x_.op();
  const std::byte* own = input_of(src_, o_.inputs, layout_, chunk, es_) + g * seg_ * es_;
  if (op.avg_inputs_unscaled) {
    const int down = -op.avg_scale_up;
    return kernels::cpu::sum_scaled_halves(out, own, down, received.data(), s == 0 ? down : 0, count, op.dtype);
  }
  kernels::cpu::reduce(out, own, received.data(), count, op.dtype, op.reduce_op);
}

// Steps 0 .. N-3: reduce each arriving segment with this rank's own
// contribution and send the partial sum on at step s+1.
void ReduceScatterRing::recv_reduce_send(int s) {
  const int c = chunk_at(s);
  StepReceives in = receive(s);
  for (std::size_t g = 0; g < in.segments(); ++g) {
    auto received = in.next();
    std::byte* out = partial(s, c) + g * seg_ * es_;
    reduce(s, out, c, g, in.count_of(g), received);
    in.release();
    std::vector<Request>& sends = o_.final_only ? slot_sent_[s % 2] : sent_;
    sends.push_back(x_.send((r_ + 1) % n_, o_.first_step + s + 1, g, out, in.count_of(g) * es_));
  }
}

// Step N-2: each segment of chunk r becomes final, reduced into dst or a
// staging slot and handed to on_final, which copies it to its place and
// sends it on; without on_final (a plain reduce-scatter) the copy and send
// are nobody's, and it is recv_reduce into dst.
void ReduceScatterRing::recv_reduce_copy_send(int s) {
  const int c = chunk_at(s);
  StepReceives in = receive(s);
  // reduce_scatter into the start of its send buffer on rank 1: dst is the
  // chunk 0 that step 0 sent from src, and a transport may still be reading
  // it (TCP copies a send's bytes as the socket takes them): the result
  // reached rank 0 in place of rank 1's input. Those sends complete as the
  // right neighbour takes step 0, which waits on nothing of this rank's.
  if (o_.final_only && !o_.first_sent && overlaps_first_step(layout_.count_of(c))) wait_all(sent_);
  for (std::size_t g = 0; g < in.segments(); ++g) {
    auto received = in.next();
    Request* slot = free_staging_slot(g);
    std::byte* out = slot ? staging_->memory + (g % FinalStaging::kSlots) * staging_->slot_bytes
                          : partial(s, c) + g * seg_ * es_;
    reduce(s, out, c, g, in.count_of(g), received);
    in.release();
    if (!o_.on_final) continue;
    Request reading = o_.on_final(g, out, in.count_of(g));
    if (slot) *slot = reading;
  }
}

}  // namespace

void reduce_scatter_ring_start(Exchange& x, const std::byte* src, const ChunkLayout& layout,
                               std::uint32_t first_step) {
  send_first_step(x, src, layout, first_step, nullptr);
}

void reduce_scatter_ring(Exchange& x, const std::byte* src, std::byte* dst, const ChunkLayout& layout,
                         const ReduceScatterRingOptions& options) {
  const int n = x.size();
  ReduceScatterRing ring(x, src, dst, layout, options);
  if (!options.first_sent) ring.send();
  for (int s = 0; s < n - 2; ++s) ring.recv_reduce_send(s);
  if (n > 1) ring.recv_reduce_copy_send(n - 2);
  ring.wait_sent();
}

void reduce_scatter(Exchange& x) {
  const Op& op = x.op();
  const std::size_t es = x.element_bytes(), n = static_cast<std::size_t>(x.size());
  ChunkLayout layout{op.count * n, x.size()};
  auto* src = static_cast<const std::byte*>(op.send);
  auto* out = static_cast<std::byte*>(op.recv);
  if (x.size() == 1) {
    if (op.send_chunks) src = static_cast<const std::byte*>(op.send_chunks[0]);
    if (out != src && op.count != 0) std::copy_n(src, op.count * es, out);
  } else {
    // In place (out is this rank's chunk of src), partial sums may overwrite
    // the caller's input, as NCCL allows; out of place, out holds only the
    // rank's own chunk. The list form keeps them in scratch either way.
    ReduceScatterRingOptions options;
    options.inputs = op.send_chunks;
    options.final_only = op.send_chunks || out != src + x.rank() * op.count * es;
    reduce_scatter_ring(x, src, options.final_only ? out : const_cast<std::byte*>(src), layout, options);
  }
  if (op.reduce_op == ReduceOp::avg) kernels::cpu::divide(out, op.count, op.dtype, x.size(), op.avg_scale_up);
}

}  // namespace braid::comm
