// The algorithm table: the one place that decides which algorithm runs a call.
//
//   all_reduce      recursive doubling up to small_all_reduce_bytes(N), ring above
//   reduce_scatter  ring
//   all_gather      ring
//   broadcast       binomial tree up to kSmallBroadcastBytes, pipelined chain above
//   reduce          pipelined chain
//   all_to_all      pairwise
//   barrier         dissemination
//   send / recv     direct
//
// BRAID_ALGO forces a choice where the collective has it (ring or
// recursive_doubling for all_reduce, binomial or pipelined for broadcast);
// elsewhere it is ignored.
//
// Every collective first proves that all ranks called it with the same
// arguments (agree_signatures: ceil(log2 N) header-only rounds) unless its
// schedule proves that by itself before writing a user buffer
// (Algorithm::agrees): a mismatch never delivers data on any rank.
//
// The all-reduce thresholds come from braid-bench on the 2-core development
// machine (BRAID_ALGO=ring vs recursive_doubling, -b 4K -e 1M, in place):
//   2 ranks: recursive doubling wins to 16 KiB (TCP) / 16 KiB (shm), the ring
//            from 64 KiB on both;
//   4 ranks: recursive doubling wins to 256 KiB on both (log2 N exchanges
//            instead of 2(N-1) ring steps, each a context switch when ranks
//            outnumber cores).
#include "comm/algorithms/algorithms.h"

namespace braid::comm {
namespace {

constexpr std::size_t kSmallBroadcastBytes = 32u << 10;

std::size_t small_all_reduce_bytes(int size) { return size <= 2 ? 32u << 10 : 256u << 10; }

}  // namespace

Algorithm select_algorithm(const Op& op, int size, std::string_view forced) {
  switch (op.kind) {
    case OpKind::all_reduce: {
      std::size_t bytes = op.count * dtype_bytes(op.dtype);
      bool small = forced == "recursive_doubling" ||
                   (forced != "ring" && bytes <= small_all_reduce_bytes(size) && size > 1);
      return small ? Algorithm{all_reduce_recursive_doubling, "recursive_doubling", true}
                   : Algorithm{all_reduce_ring, "ring"};
    }
    case OpKind::reduce_scatter: return {reduce_scatter, "ring"};
    case OpKind::all_gather: return {all_gather, "ring"};
    case OpKind::broadcast: {
      std::size_t bytes = op.count * dtype_bytes(op.dtype);
      bool small = forced == "binomial" || (forced != "pipelined" && bytes <= kSmallBroadcastBytes);
      return small ? Algorithm{broadcast_binomial, "binomial"} : Algorithm{broadcast_pipelined, "pipelined"};
    }
    case OpKind::reduce: return {reduce_pipelined, "pipelined"};
    case OpKind::all_to_all: return {all_to_all_pairwise, "pairwise"};
    case OpKind::barrier: return {barrier_dissemination, "dissemination", true};
    case OpKind::send: return {send_direct, "direct", true};
    case OpKind::recv: return {recv_direct, "direct", true};
  }
  return {};
}

}  // namespace braid::comm
