// Ring all-reduce = ring reduce-scatter + ring all-gather.
//
// The reduce-scatter leaves chunk r fully reduced on rank r, accumulating in
// the output buffer (so in place and out of place share one path); for avg
// each rank divides its own chunk by N before the all-gather circulates it.
// The two phases overlap: a segment of the own chunk is sent on as soon as
// it is final.
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

void all_reduce_ring(Exchange& x) {
  const Op& op = x.op();
  const std::size_t es = x.element_bytes();
  auto* out = static_cast<std::byte*>(op.recv);
  auto* in = static_cast<const std::byte*>(op.send);
  const int n = x.size(), right = (x.rank() + 1) % n;
  if (n == 1) {
    if (op.send != op.recv) std::memcpy(out, op.send, op.count * es);
    return;
  }
  const std::size_t chunk = x.tuning().chunk_bytes / es;
  const std::size_t round = chunk == 0 ? op.count : std::max<std::size_t>(1, chunk) * static_cast<std::size_t>(n);
  const auto steps_per_round = static_cast<std::uint32_t>(2 * (n - 1));
  auto layout_at = [&](std::size_t first) { return ChunkLayout{std::min(round, op.count - first), n}; };
  // With 2 ranks the all-gather only receives, so the next round's first
  // sends can follow this round's all-gather sends on the link at once; with
  // more, the all-gather forwards, and they must wait until it has.
  const bool early = n == 2;
  // Out of place, the output is written with streaming stores from staging
  // slots (reduce_scatter_ring), sparing the read-for-ownership of memory
  // that is only overwritten; in place the output was just read, so it is
  // in cache and plain stores are cheaper.
  const std::size_t seg = segment_count(x);
  const std::size_t stream_bytes = x.tuning().stream_bytes;
  const bool stage = op.send != op.recv && stream_bytes != 0 && op.count * es >= stream_bytes;
  FinalStaging staging;
  if (stage) staging = {x.scratch(FinalStaging::kSlots * seg * es), seg * es};
  std::uint32_t step = 0;
  for (std::size_t first = 0; first < op.count; first += round, step += steps_per_round) {
    const ChunkLayout layout = layout_at(first);
    if (first == 0 || !early) reduce_scatter_ring_start(x, in + first * es, layout, step);
    std::byte* o = out + first * es;
    const std::uint32_t ag_first_step = step + static_cast<std::uint32_t>(n - 1);
    reduce_scatter_ring(
        x, in + first * es, o, layout, false,
        [&](std::size_t g, std::byte* data, std::size_t count) {
          if (op.reduce_op == ReduceOp::avg) kernels::cpu::divide(data, count, op.dtype, n);
          std::byte* place = o + (layout.offset(x.rank()) + g * seg) * es;
          if (data != place) kernels::cpu::stream_copy(place, data, count * es);
          return x.send(right, ag_first_step, g, data, count * es);
        },
        step, true, stage ? &staging : nullptr);
    if (early && first + round < op.count)
      reduce_scatter_ring_start(x, in + (first + round) * es, layout_at(first + round), step + steps_per_round);
    all_gather_ring(x, o, layout, ag_first_step, true, stage ? Placement::streamed : Placement::cached);
  }
  x.wait_sends();
}

}  // namespace braid::comm
