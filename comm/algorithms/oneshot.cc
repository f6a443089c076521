#include "comm/algorithms/oneshot.h"

#include <string>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/reducer.h"
#include "kernels/cpu/reduce.h"
#include "runtime/errors.h"

namespace braid::comm {

namespace {

[[noreturn, gnu::noinline]] void does_not_fit(Exchange& x, std::size_t bytes) {
  throw InvalidUsage(describe(x.op()) + ": a one-shot collective of " + std::to_string(bytes) + " bytes on " +
                     std::to_string(x.size()) + " ranks does not fit the shared slots");
}

// Inline: every one-shot call asks it; only the refusal builds a sentence.
inline void check_fits(Exchange& x, std::size_t bytes) {
  if (x.size() > kMaxOneshotRanks || bytes > x.slot_capacity()) does_not_fit(x, bytes);
}

}  // namespace

SlotViews share_slots(Exchange& x, const void* data, std::size_t bytes) {
  check_fits(x, bytes);
  SlotViews views;
  x.share_slots(data, bytes, {views.at.data(), static_cast<std::size_t>(x.size())});
  return views;
}

const void* share_root_slot(Exchange& x, const void* data, std::size_t bytes) {
  check_fits(x, bytes);
  return x.share_root_slot(data, bytes);
}

// A small call (the common one) is reduced straight into the output by
// the kernels, pass after pass: the same operations in the same order as
// the host reducer's, without its blocking and scratch, which pay only once
// the output no longer stays in the first-level cache between passes.
void reduce_slots(SlotViews views, int rank, int size, const Op& op) {
  constexpr std::size_t kStraightBytes = 16u << 10;
  if (op.send != op.recv) views.at[rank] = op.send;
  const std::size_t bytes = op.count * dtype_bytes(op.dtype);
  const int divisor = op.reduce_op == ReduceOp::avg ? size : 0;
  if (bytes > kStraightBytes) {
    void* out[] = {op.recv};
    return host_reducer().reduce_multi(out, views.all(size), op.count, op.dtype, op.reduce_op,
                                       {.divisor = divisor, .scale_up = op.avg_scale_up});
  }
  kernels::cpu::reduce(op.recv, views.at[0], views.at[1], op.count, op.dtype, op.reduce_op);
  for (int k = 2; k < size; ++k) kernels::cpu::reduce(op.recv, op.recv, views.at[k], op.count, op.dtype, op.reduce_op);
  if (divisor != 0) kernels::cpu::divide(op.recv, op.count, op.dtype, divisor, op.avg_scale_up);
}

// On a communicator with shared slots every collective agrees through them
// (oneshot.h): its signature alone, published and checked against every
// peer's.
void agree_through_slots(Exchange& x) { share_slots(x, nullptr, 0); }

}  // namespace braid::comm
