// Recursive-doubling all-reduce, for small messages where latency dominates.
//
// With P the largest power of two <= N, ranks P .. N-1 first fold their
// vector into rank r-P. Then in round k (0 .. log2 P - 1) every rank r < P
// swaps its whole vector with rank r XOR 2^k and reduces, so after log2 P
// rounds each holds the full reduction; finally the folded ranks get the
// result back. That is log2 P + 2 message latencies instead of the ring's
// 2(N-1). Partners reduce the same two operands in the same order, the
// lower rank's first, so every rank ends with bit-identical results: IEEE
// addition and multiplication give the same value either way, but of two
// NaNs x86 keeps the first operand's sign and payload, so in swapped orders
// the partners of a -NaN and a +NaN ended with different bits.
//
// The vector is reduced in scratch and copied to the output only at the
// end. By then a rank has checked the header of its partner in every round,
// and each partner had checked its own partners before sending, so every
// rank is known to have called the same operation (the folded ranks learn it
// from the result they get back): a mismatch fails before any user buffer is
// written, without the agreement rounds other algorithms need first.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "kernels/cpu/reduce.h"

namespace braid::comm {

void all_reduce_recursive_doubling(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size(), r = x.rank();
  const std::size_t bytes = op.count * x.element_bytes();
  std::byte* acc = x.scratch(bytes);
  std::memcpy(acc, op.send, bytes);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const std::uint32_t fold_step = 0, return_step = 64;
  auto reduce_from = [&](int peer, std::uint32_t step) {
    Request in = x.recv_view(peer, step, 0, bytes);
    x.wait(in);
    kernels::cpu::reduce(acc, acc, x.view(in).data(), op.count, op.dtype, op.reduce_op);
    x.release(in);
  };
  if (r >= p) {
    x.wait(x.send(r - p, fold_step, 0, acc, bytes));
    x.wait(x.recv(r - p, return_step, 0, op.recv, bytes));  // from a rank that checked them all
    return;
  }
  if (r + p < n) reduce_from(r + p, fold_step);
  for (int k = 0; (1 << k) < p; ++k) {
    int partner = r ^ (1 << k);
    Request sent = x.send(partner, 1 + k, 0, acc, bytes);
    Request in = x.recv_view(partner, 1 + k, 0, bytes);
    x.wait(in);
    x.wait(sent);  // `acc` is rewritten below
    const std::byte* theirs = x.view(in).data();
    if (r < partner)
      kernels::cpu::reduce(acc, acc, theirs, op.count, op.dtype, op.reduce_op);
    else
      kernels::cpu::reduce(acc, theirs, acc, op.count, op.dtype, op.reduce_op);
    x.release(in);
  }
  if (op.reduce_op == ReduceOp::avg) kernels::cpu::divide(acc, op.count, op.dtype, n, op.avg_scale_up);
  if (r + p < n) x.send(r + p, return_step, 0, acc, bytes);
  std::memcpy(op.recv, acc, bytes);
  x.wait_sends();
}

}  // namespace braid::comm
