// The algorithm table: the one place that decides which algorithm runs a call.
//
//   all_reduce      recursive doubling up to kSmallAllReduceBytes, ring above
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
// elsewhere it is ignored. The threshold
// comes from braid-bench runs on 2 to 8 ranks over loopback TCP: below it the
// ring's 2(N-1) latencies cost more than recursive doubling's extra bytes.
#include "comm/algorithms/algorithms.h"

namespace braid::comm {
namespace {

constexpr std::size_t kSmallAllReduceBytes = 32u << 10;
constexpr std::size_t kSmallBroadcastBytes = 32u << 10;

}  // namespace

Algorithm select_algorithm(const Op& op, int size, std::string_view forced) {
  switch (op.kind) {
    case OpKind::all_reduce: {
      std::size_t bytes = op.count * dtype_bytes(op.dtype);
      bool small = forced == "recursive_doubling" ||
                   (forced != "ring" && bytes <= kSmallAllReduceBytes && size > 1);
      return small ? Algorithm{all_reduce_recursive_doubling, "recursive_doubling"}
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
    case OpKind::barrier: return {barrier_dissemination, "dissemination"};
    case OpKind::send: return {send_direct, "direct"};
    case OpKind::recv: return {recv_direct, "direct"};
  }
  return {};
}

}  // namespace braid::comm
