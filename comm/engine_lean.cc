// The engine's lean path: a small collective goes from the public call
// straight to its algorithm, in the caller's thread, with none of the
// engine's per-call bookkeeping. Two kinds of communicator have one:
//  - one with shared slots (every rank on this host over shm, at most 16
//    ranks; issue 18): the kinds that select.cc runs one-shot through the
//    slots (comm/algorithms/oneshot.h) whatever the call's registration and
//    placement, up to a slot and BRAID_INLINE_BYTES;
//  - any other (ranks across hosts over TCP or RDMA, issue 15): the kinds
//    whose algorithm select.cc answers the same for every call up to
//    BRAID_INLINE_BYTES (steady_algorithm: recursive doubling for a small
//    all_reduce, the binomial broadcast, the dissemination barrier, ...).
// Each kind's algorithm is asked once (prepare()), not per call. A call
// takes the path when its buffers are in host memory, it is no larger than
// its kind's limit, small calls may run inline (Communicator::set_inline),
// and nothing of this communicator is queued or running:
// then issue order is run order, as on the engine's own paths, and the call
// has its sequence number before any later one.
//
// What it leaves out is what only the queue needs or what the call's own
// messages make redundant: no WorkState per call (a completed call shares
// one), no lock, no CallShape and table lookup per call, and no clock until
// a wait actually blocks (the Exchange's deadline starts there, so the
// first message of a call leaves without one: on a host whose clock is slow
// to read that is most of a small call's cost). One-shot algorithms need no
// separate signature agreement (the slots carry each rank's signature and
// every reader checks it before it uses a byte); the others run it first
// where their own schedule does not prove agreement (Algorithm::agrees), as
// on the engine's path. A peer that dies or never comes is still named
// within the timeout: the waits are the algorithms' own. A failure aborts
// the communicator exactly as on the engine's other paths (Impl::fail).
#include <algorithm>

#include "comm/communicator_impl.h"
#include "runtime/errors.h"

namespace braid::comm {

// Once, after the transports are connected: the slots, and the algorithm
// and largest call of each kind the lean path takes.
void Communicator::Impl::prepare() {
  find_slots(exchange);
  CallShape shape;
  shape.ranks = size;
  shape.one_host = one_host;
  shape.transport = config.transport;
  shape.forced = forced_algo;
  shape.slot_bytes = slot_capacity(exchange);
  for (std::size_t kind = 0; kind < lean_by_kind.size() && kind <= static_cast<std::size_t>(OpKind::barrier); ++kind) {
    shape.kind = static_cast<OpKind>(kind);
    if (auto algorithm = oneshot_whenever_fits(shape))
      lean_by_kind[kind] = {*algorithm, std::min(shape.slot_bytes, inline_bytes)};
    else if (shape.slot_bytes == 0 && size > 1)
      lean_by_kind[kind] = steady_lean(shape);
  }
}

// The largest call up to BRAID_INLINE_BYTES, halving from there, below
// which select.cc's answer for shape.kind does not change (its first
// threshold, or the power of two under it), and that answer.
Communicator::Impl::Lean Communicator::Impl::steady_lean(const CallShape& shape) const {
  constexpr std::size_t kSmallest = 64;
  for (std::size_t bytes = inline_bytes; bytes >= kSmallest; bytes /= 2)
    if (auto steady = steady_algorithm(shape, bytes)) return {*steady, bytes};
  return {};
}

void Communicator::Impl::prepare_once() {
  std::lock_guard lock(prepare_mu);
  if (prepared.load(std::memory_order_relaxed)) return;
  prepare();
  prepared.store(true, std::memory_order_release);
}

std::shared_ptr<WorkState> Communicator::Impl::try_lean(Op& op, StagedInput& input) {
  if (!inline_on.load(std::memory_order_relaxed)) return nullptr;
  ensure_prepared();
  Lean& lean = lean_by_kind[static_cast<std::size_t>(op.kind)];
  const std::size_t bytes = op.count * dtype_bytes(op.dtype);
  if (!lean.algorithm.run || bytes > lean.bytes || op.memory.kind != runtime::MemoryKind::host) return nullptr;
  // Claims the engine, and the call's sequence number with it, in one
  // compare-exchange of the gate; where anything is queued or running or
  // the communicator failed (kBusy), the call goes the engine's way. A
  // release too: Communicator::abort, seeing kLean, reads what prepare()
  // wrote in this thread.
  std::uint64_t before = gate.load(std::memory_order_relaxed);
  const std::uint64_t held = (before + kOneSeq) | kBusy | kLean;
  if ((before & kBusy) ||
      !gate.compare_exchange_strong(before, held, std::memory_order_acq_rel, std::memory_order_relaxed))
    return nullptr;
  op.seq = before / kOneSeq;
  std::exception_ptr error;
  try {
    // nothing was queued before it: no earlier call writes the input now
    input.fill(op, lean.algorithm.scales_avg_inputs, lean.algorithm.maps_inputs);
    if (status) status->entered(op, &exchange.waiting_for);
    if (lean.noted_bytes != bytes) {  // only the thread that holds the gate writes it
      Algorithm algorithm = lean.algorithm;
      algorithm.reason.bytes = bytes;
      note_choice(op.kind, algorithm);
      lean.noted_bytes = bytes;
    }
    op.algorithm = lean.algorithm.id;
    Exchange x(op, exchange, timeout, peer_state);
    if (!lean.algorithm.agrees) agree_signatures(x);
    lean.algorithm.run(x);
    if (status) status->left(op);
  } catch (...) {
    error = fail(op, std::current_exception());
  }
  // The gate as this call left it: nothing was queued meanwhile, the engine
  // is idle again. Otherwise (or after a failure) the engine takes over.
  std::uint64_t expected = held;
  if (error || !gate.compare_exchange_strong(expected, held & ~(kBusy | kLean), std::memory_order_release,
                                             std::memory_order_relaxed))
    hand_over();
  if (!error) return completed_work();
  auto state = std::make_shared<WorkState>();
  state->failure_seen = failure_seen;
  state->complete_unshared(error);
  return state;
}

}  // namespace braid::comm
