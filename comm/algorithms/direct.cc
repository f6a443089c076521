// The phases every direct collective shares (direct.h explains them).
#include "comm/algorithms/direct.h"

#include <algorithm>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/reducer.h"
#include "runtime/errors.h"

namespace braid::comm {
DirectBuffers open_direct(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size(), me = x.rank();
  const std::size_t es = x.element_bytes();
  auto send_bytes = [&](int rank) { return send_elements(op, rank, n) * es; };
  auto recv_bytes = [&](int rank) { return recv_elements(op, rank, n) * es; };
  DirectSwap mine;
  const auto device = x.device_id();
  std::copy(device.begin(), device.end(), mine.vote.device);
  mine.vote.workers = x.direct_workers();
  mine.ready = x.call_ready();
  mine.done = x.reducer().done_event();
  mine.flags = x.call_flags();
  if ((send_bytes(me) && !x.find_region(op.send, send_bytes(me), mine.send)) ||
      (recv_bytes(me) && !x.find_region(op.recv, recv_bytes(me), mine.recv)))
    throw InvalidUsage(describe(op) + ": a direct collective needs send and receive buffers in registered memory "
                       "that every peer can map");
  std::vector<DirectSwap> theirs(static_cast<std::size_t>(n));
  x.swap_with_all(kDirectStep, &mine, theirs.data(), sizeof(DirectSwap));

  DirectBuffers b;
  theirs[static_cast<std::size_t>(me)] = mine;
  b.stream_ordered = stream_ordered(theirs);
  b.flag_ordered = flag_ordered(theirs);
  x.note_stream_ordered(b.stream_ordered, b.flag_ordered);
  // Flags on some ranks only: theirs did not wait for their inputs; every
  // rank hears that they have before anything reads them.
  const bool some_flags = std::any_of(theirs.begin(), theirs.end(), [](const DirectSwap& s) { return s.flags.set(); });
  if (some_flags && !b.flag_ordered) {
    if (mine.flags.set()) x.wait_call_input();
    std::uint8_t token = 1;
    std::vector<std::uint8_t> tokens(static_cast<std::size_t>(n));
    x.swap_with_all(kDirectStep + 2, &token, tokens.data(), 1);
  }
  for (const DirectSwap& s : theirs) b.done.push_back(s.done);
  const bool one = one_direct_worker(theirs);
  x.note_direct_workers(one);
  if (peer_on_this_gpu(theirs, me)) x.note_gpu_shared();
  if (!one) {
    b.shares = {me};
  } else if (me == 0) {
    for (int p = 0; p < n; ++p) b.shares.push_back(p);
  }
  // A rank with no share touches no peer's buffer, so it maps none: rank 0
  // checks every reference.
  b.send.assign(static_cast<std::size_t>(n), nullptr);
  b.recv.assign(static_cast<std::size_t>(n), nullptr);
  // What each peer's call uses follows from the op, not from its message:
  // a reference a peer left out where its call needs a buffer is refused.
  for (int p = 0; p < n && !b.shares.empty(); ++p) {
    if (p == me) {
      if (send_bytes(p)) b.send[p] = static_cast<const std::byte*>(op.send);
      if (recv_bytes(p)) b.recv[p] = static_cast<std::byte*>(op.recv);
      continue;
    }
    if (send_bytes(p)) b.send[p] = x.peer_region(p, theirs[p].send, send_bytes(p)).data();
    if (recv_bytes(p)) b.recv[p] = x.peer_region(p, theirs[p].recv, recv_bytes(p)).data();
  }
  // Every rank queues its flag kernels, with a share or without.
  if (b.flag_ordered) {
    std::vector<DeviceFlagsRef> flags;
    for (const DirectSwap& s : theirs) flags.push_back(s.flags);
    x.reducer().order_by_flags(flags, me, op.stream);
    return b;
  }
  if (b.shares.empty()) return b;
  // Whatever this rank's own mode: a rank whose swap carries `ready` did
  // not wait for its input on the host.
  std::vector<DeviceEventRef> ready;
  for (const DirectSwap& s : theirs)
    if (s.ready.set()) ready.push_back(s.ready);
  if (!ready.empty()) x.reducer().wait_for(ready);
  return b;
}

bool stream_ordered(std::span<const DirectSwap> swapped) {
  return std::all_of(swapped.begin(), swapped.end(), [](const DirectSwap& s) { return s.ready.set(); });
}

bool flag_ordered(std::span<const DirectSwap> swapped) {
  if (!std::all_of(swapped.begin(), swapped.end(), [](const DirectSwap& s) { return s.flags.set(); })) return false;
  for (std::size_t p = 1; p < swapped.size(); ++p)
    if (swapped[p].flags.call != swapped[0].flags.call)
      throw RemoteError("the ranks' calls ordered by flags are out of step: rank 0 makes its call " +
                        std::to_string(swapped[0].flags.call) + ", rank " + std::to_string(p) + " its call " +
                        std::to_string(swapped[p].flags.call));
  return true;
}

bool peer_on_this_gpu(std::span<const DirectSwap> swapped, int me) {
  const std::uint8_t* mine = swapped[static_cast<std::size_t>(me)].vote.device;
  if (std::all_of(mine, mine + 16, [](std::uint8_t b) { return b == 0; })) return false;  // host memory
  for (std::size_t p = 0; p < swapped.size(); ++p)
    if (p != static_cast<std::size_t>(me) && std::equal(mine, mine + 16, swapped[p].vote.device)) return true;
  return false;
}

bool one_direct_worker(std::span<const DirectSwap> swapped) {
  const WorkerVote& first = swapped.front().vote;
  bool every_one = true, one_device = true;
  for (const DirectSwap& s : swapped) {
    const WorkerVote& v = s.vote;
    if (v.workers == DirectWorkers::all) return false;
    every_one = every_one && v.workers == DirectWorkers::one;
    one_device = one_device && std::equal(std::begin(v.device), std::end(v.device), std::begin(first.device));
  }
  if (every_one) return true;
  const bool on_gpu = std::any_of(std::begin(first.device), std::end(first.device), [](std::uint8_t b) { return b; });
  return one_device && on_gpu;
}

// The token: 1, "my share is written" (or I have none); 2, "my share is
// queued behind my `done` event" (stream order only); 3, "my share is queued
// before my flag" (stream order by flags: every rank's, so no token is 1).
void close_direct(Exchange& x, const DirectBuffers& b) {
  std::uint8_t token = 1;
  if (b.flag_ordered) {
    x.reducer().finish_flagged();
    x.peer_regions_used();
    token = 3;
    std::vector<std::uint8_t> tokens(static_cast<std::size_t>(x.size()));
    x.swap_with_all(kDirectStep + 1, &token, tokens.data(), 1);
    return;
  }
  if (!b.stream_ordered) x.reducer().finish(x.deadline());
  else if (!b.shares.empty() && x.reducer().finish_queued(x.deadline())) token = 2;
  x.peer_regions_used();
  std::vector<std::uint8_t> tokens(static_cast<std::size_t>(x.size()));
  x.swap_with_all(kDirectStep + 1, &token, tokens.data(), 1);
  tokens[static_cast<std::size_t>(x.rank())] = token;
  if (!b.stream_ordered) return;
  for (std::size_t p = 0; p < tokens.size(); ++p) {
    if (tokens[p] != 2) continue;
    if (!b.done[p].set())
      throw RemoteError(describe(x.op()) + ": rank " + std::to_string(p) +
                        " queued its share behind an event it did not name");
    x.wait_on_stream(b.done[p]);
  }
}

std::vector<int> this_rank_first(int rank, int size) {
  std::vector<int> order{rank};
  for (int p = 0; p < size; ++p)
    if (p != rank) order.push_back(p);
  return order;
}

void direct_step(Exchange& x, const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                 std::size_t count, bool reduces) {
  if (count == 0) return;
  const Op& op = x.op();
  Averaging avg;
  if (reduces && op.reduce_op == ReduceOp::avg) {
    avg.divisor = x.size();
    avg.scale_up = op.avg_scale_up;
    avg.source_shift = op.avg_inputs_unscaled ? -op.avg_scale_up : 0;  // srcs are the ranks' inputs
  }
  x.reducer().reduce_multi(dsts, srcs, count, op.dtype, reduces ? op.reduce_op : ReduceOp::sum, avg);
}

}  // namespace braid::comm
