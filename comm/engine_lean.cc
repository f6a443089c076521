// The engine's lean path (issue 18): a small collective that select.cc runs
// one-shot through the shared slots (comm/algorithms/oneshot.h) goes from
// the public call straight to the slot protocol, in the caller's thread.
//
// It applies when the communicator has shared slots (every rank on this
// host over shm, at most 16 ranks), the call's kind has a one-shot
// algorithm that select.cc runs whatever the call's registration and
// placement (asked once per kind, not per call), the call fits a slot and
// BRAID_INLINE_BYTES, its buffers are in host memory, and nothing of this
// communicator is queued or running: then issue order is run order, as on
// the engine's own paths, and the call has its sequence number before any
// later one.
//
// What it leaves out is what the slot protocol makes redundant or what only
// the queue needs: no WorkState per call (a completed call shares one), no
// CallShape and table lookup per call, no signature agreement (the slots
// carry each rank's signature and every reader checks it before it uses a
// byte: a mismatched call fails every rank with both calls named), and no
// clock until a wait actually blocks (the Exchange's deadline starts there).
// A peer that dies or never comes is still named within the timeout: the
// waits are the one-shot algorithms' own. A failure aborts the
// communicator exactly as on the engine's other paths (Impl::fail).
#include <algorithm>

#include "comm/communicator_impl.h"
#include "runtime/errors.h"

namespace braid::comm {

// Once, after the transports are connected: the slots, and the one-shot
// algorithm and largest call of each kind the lean path takes.
void Communicator::Impl::prepare() {
  find_slots(exchange);
  CallShape shape;
  shape.ranks = size;
  shape.one_host = one_host;
  shape.transport = config.transport;
  shape.forced = forced_algo;
  shape.slot_bytes = slot_capacity(exchange);
  for (std::size_t kind = 0; kind < lean_by_kind.size(); ++kind) {
    shape.kind = static_cast<OpKind>(kind);
    if (auto algorithm = oneshot_whenever_fits(shape))
      lean_by_kind[kind] = {*algorithm, std::min(shape.slot_bytes, inline_bytes)};
  }
}

std::shared_ptr<WorkState> Communicator::Impl::try_lean(Op& op) {
  std::call_once(prepared, [this] { prepare(); });
  const Lean& lean = lean_by_kind[static_cast<std::size_t>(op.kind)];
  const std::size_t bytes = op.count * dtype_bytes(op.dtype);
  if (!lean.algorithm.run || bytes > lean.bytes || op.memory.kind != runtime::MemoryKind::host) return nullptr;
  // Claims the engine, and the call's sequence number with it, in one
  // compare-exchange of the gate; where anything is queued or running or
  // the communicator failed (kBusy), the call goes the engine's way.
  std::uint64_t before = gate.load(std::memory_order_relaxed);
  const std::uint64_t held = (before + kOneSeq) | kBusy | kLean;
  if ((before & kBusy) ||
      !gate.compare_exchange_strong(before, held, std::memory_order_acquire, std::memory_order_relaxed))
    return nullptr;
  op.seq = before / kOneSeq;
  std::exception_ptr error;
  try {
    if (status) status->entered(op, &exchange.waiting_for);
    Algorithm algorithm = lean.algorithm;
    algorithm.reason.bytes = bytes;
    note_choice(op.kind, algorithm);
    Exchange x(op, exchange, timeout, peer_state);
    algorithm.run(x);
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
  state->complete_unshared(error);
  return state;
}

}  // namespace braid::comm
