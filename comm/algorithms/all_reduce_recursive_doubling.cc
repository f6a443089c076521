// Recursive-doubling all-reduce, for small messages where latency dominates.
//
// With P the largest power of two <= N, ranks P .. N-1 first fold their
// vector into rank r-P. Then in round k (0 .. log2 P - 1) every rank r < P
// swaps its whole vector with rank r XOR 2^k and reduces, so after log2 P
// rounds each holds the full reduction; finally the folded ranks get the
// result back. That is log2 P + 2 message latencies instead of the ring's
// 2(N-1). Partners reduce the same two operands (in swapped order, which IEEE
// addition and multiplication do not notice), so every rank ends with
// bit-identical results.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "kernels/cpu/reduce.h"

namespace braid::comm {

void all_reduce_recursive_doubling(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size(), r = x.rank();
  const std::size_t bytes = op.count * x.element_bytes();
  auto* out = static_cast<std::byte*>(op.recv);
  if (op.send != op.recv) std::memcpy(out, op.send, bytes);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const std::uint32_t fold_step = 0, return_step = 64;
  auto reduce_from = [&](int peer, std::uint32_t step) {
    Request in = x.recv_view(peer, step, 0, bytes);
    x.wait(in);
    kernels::cpu::reduce(out, out, x.view(in).data(), op.count, op.dtype, op.reduce_op);
    x.release(in);
  };
  if (r >= p) {
    x.wait(x.send(r - p, fold_step, 0, out, bytes));
    x.wait(x.recv(r - p, return_step, 0, out, bytes));
    return;
  }
  if (r + p < n) reduce_from(r + p, fold_step);
  for (int k = 0; (1 << k) < p; ++k) {
    int partner = r ^ (1 << k);
    Request sent = x.send(partner, 1 + k, 0, out, bytes);
    Request in = x.recv_view(partner, 1 + k, 0, bytes);
    x.wait(in);
    x.wait(sent);  // `out` is rewritten below
    kernels::cpu::reduce(out, out, x.view(in).data(), op.count, op.dtype, op.reduce_op);
    x.release(in);
  }
  if (op.reduce_op == ReduceOp::avg) kernels::cpu::divide(out, op.count, op.dtype, n);
  if (r + p < n) x.wait(x.send(r + p, return_step, 0, out, bytes));
}

}  // namespace braid::comm
