// Ring all-reduce = ring reduce-scatter + ring all-gather.
//
// The reduce-scatter leaves chunk r fully reduced on rank r, accumulating in
// the output buffer (so in place and out of place share one path); for avg
// each rank divides its own chunk by N before the all-gather circulates it.
// The two phases overlap: a segment of the own chunk is sent on as soon as
// it is final. In the verbs of DESIGN.md (NCCL's device/all_reduce.h reads
// the same) one round is
//
//   send                     reduce_scatter_ring_start
//   recv_reduce_send x N-2   reduce_scatter_ring, whose last step hands
//   recv_reduce_copy_send    each final segment to copy_send (below): the
//                            all-gather's step 0
//   recv_copy_send x N-2     all_gather_ring, its step 0 already sent
//   recv
//
// A large message runs in rounds, each a full reduce-scatter + all-gather of
// N chunks of BRAID_CHUNK_BYTES: within a round the all-gather sends a
// reduced segment while it is still in cache (in one round over the whole
// message, the all-gather's sends queue behind the whole reduce-scatter and
// read the output back from memory, which is what bounds large all-reduces
// on shared memory); with 2 ranks each round's first reduce-scatter step is
// posted before the previous round's all-gather is waited for, so the pair
// does not drain between rounds. Measured on 2 ranks over shm, 64 and
// 256 MiB, medians: in place 0.49-0.57 -> 0.57-0.65 x memcpy, out of place
// 0.42-0.48 -> 0.45-0.49; over TCP rounds matter more (one round: 0.11).
//
// Out of place from BRAID_STREAM_BYTES on, the output is written with
// non-temporal stores: final segments are reduced into two cache-resident
// staging slots, sent on from there and streamed into the output, and the
// all-gather's last receives are streamed too, so no output line is read
// before it is overwritten. Measured the same way, runs alternated, medians
// of three sets: 0.44-0.49 -> 0.46-0.55 x memcpy at 64 / 256 MiB (+5 to +13%
// within each set); TCP unchanged.
//
// Per rank this sends 2(N-1)/N of the message, the bandwidth optimum, and
// suits every message large enough that bandwidth, not latency, dominates.
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "kernels/cpu/reduce.h"

namespace braid::comm {
namespace {

// One all-reduce, cut into rounds of round_ elements.
class AllReduceRing {
 public:
  explicit AllReduceRing(Exchange& x);
  void run() {
    std::uint32_t step = 0;
    for (std::size_t first = 0; first < op_.count; first += round_, step += steps_per_round_)
      run_round(first, step);
    x_.wait_sends();
  }

 private:
  ChunkLayout layout_at(std::size_t first) const { return {std::min(round_, op_.count - first), n_}; }
  const std::byte* in_at(std::size_t first) const { return in_ + first * es_; }
  void run_round(std::size_t first, std::uint32_t step);

  Exchange& x_;
  const Op& op_;
  const std::byte* in_;
  std::byte* out_;
  const int n_;
  const std::size_t es_, seg_;
  std::size_t round_;
  std::uint32_t steps_per_round_;
  bool early_, stage_;
  FinalStaging staging_;
};

AllReduceRing::AllReduceRing(Exchange& x)
    : x_(x), op_(x.op()), in_(static_cast<const std::byte*>(op_.send)), out_(static_cast<std::byte*>(op_.recv)),
      n_(x.size()), es_(x.element_bytes()), seg_(segment_count(x)) {
  const std::size_t chunk = x.tuning().chunk_bytes / es_;
  round_ = chunk == 0 ? op_.count : std::max<std::size_t>(1, chunk) * static_cast<std::size_t>(n_);
  steps_per_round_ = static_cast<std::uint32_t>(2 * (n_ - 1));
  // With 2 ranks the all-gather only receives, so the next round's first
  // sends can follow this round's all-gather sends on the link at once; with
  // more, the all-gather forwards, and they must wait until it has.
  early_ = n_ == 2;
  // Out of place, the output is written with streaming stores from staging
  // slots (reduce_scatter_ring), sparing the read-for-ownership of memory
  // that is only overwritten; in place the output was just read, so it is
  // in cache and plain stores are cheaper.
  const std::size_t stream_bytes = x.tuning().stream_bytes;
  stage_ = op_.send != op_.recv && stream_bytes != 0 && op_.count * es_ >= stream_bytes;
  // A slot holds the largest segment the call sends: a segment, or a whole
  // chunk where chunks are smaller (the first round's chunk 0 is the
  // largest). Sized by BRAID_SEGMENT_BYTES alone, a segment of 1 GiB had a
  // 4 MiB call fault in and keep 2 GiB of scratch (a review helper's case).
  const std::size_t slot = std::min(seg_, layout_at(0).count_of(0)) * es_;
  if (stage_) staging_ = {x.scratch(FinalStaging::kSlots * slot), slot};
}

// One round over the elements from `first`, on the wire steps from `step`.
void AllReduceRing::run_round(std::size_t first, std::uint32_t step) {
  const ChunkLayout layout = layout_at(first);
  std::byte* out = out_ + first * es_;
  const std::uint32_t gather_step = step + static_cast<std::uint32_t>(n_ - 1);
  // The copy_send of recv_reduce_copy_send: a final segment of this rank's
  // chunk is divided for avg, copied to its place in the output (it is there
  // already unless staged) and sent as the all-gather's step 0.
  auto copy_send = [&](std::size_t g, std::byte* data, std::size_t count) {
    if (op_.reduce_op == ReduceOp::avg) kernels::cpu::divide(data, count, op_.dtype, n_, op_.avg_scale_up);
    std::byte* place = out + (layout.offset(x_.rank()) + g * seg_) * es_;
    if (data != place) kernels::cpu::stream_copy(place, data, count * es_);
    return x_.send((x_.rank() + 1) % n_, gather_step, g, data, count * es_);
  };
  // send (with 2 ranks, posted by the previous round)
  if (first == 0 || !early_) reduce_scatter_ring_start(x_, in_at(first), layout, step);
  // recv_reduce_send x N-2, recv_reduce_copy_send
  reduce_scatter_ring(x_, in_at(first), out, layout,
                      {.first_step = step, .first_sent = true, .on_final = copy_send,
                       .staging = stage_ ? &staging_ : nullptr});
  // With 2 ranks, the next round's send goes out now, so the pair does not drain.
  if (early_ && first + round_ < op_.count)
    reduce_scatter_ring_start(x_, in_at(first + round_), layout_at(first + round_), step + steps_per_round_);
  // recv_copy_send x N-2, recv
  all_gather_ring(x_, out, layout,
                  {.first_step = gather_step, .first_sent = true,
                   .last_step = stage_ ? Placement::streamed : Placement::cached});
}

}  // namespace

void all_reduce_ring(Exchange& x) {
  const Op& op = x.op();
  if (x.size() > 1) return AllReduceRing(x).run();
  if (op.send != op.recv) std::memcpy(op.recv, op.send, op.count * x.element_bytes());
}

}  // namespace braid::comm
