// Direct all-reduce over registered shared buffers (comm/shared_buffers.h).
//
// When every rank's send and receive buffers lie in memory allocated with
// Communicator::allocate and the ranks share a host, no transport ring is
// needed: the ranks swap where their buffers are (a small message each way,
// which also says "my input is ready"), map each other's, and rank r reduces
// chunk r of every input straight into chunk r of every output, in blocks
// that stay in L1/L2 between the reduce and the copies out. A second message
// round says "your output is written". Each byte is read once and written
// once: half the memory traffic of the ring over shared-memory rings.
//
// The descriptor messages use a step number no other algorithm uses, so a
// rank that took another algorithm (its buffers were not registered) fails
// with a header mismatch naming both calls instead of mixing protocols.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/shared_buffers.h"
#include "kernels/cpu/reduce.h"

namespace braid::comm {
namespace {

constexpr std::uint32_t kDescriptorStep = 0x7fff0000u;
constexpr std::size_t kBlockBytes = 32u << 10;

struct Buffers {
  SharedBufferRef send, recv;
};

}  // namespace

bool all_reduce_direct_applies(const Op& op) {
  const std::size_t bytes = op.count * dtype_bytes(op.dtype);
  SharedBufferRef ref;
  return op.kind == OpKind::all_reduce && bytes >= kDirectAllReduceMinBytes &&
         shared_buffers::find(op.send, bytes, ref) && shared_buffers::find(op.recv, bytes, ref);
}

void all_reduce_direct(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size(), me = x.rank();
  const std::size_t es = x.element_bytes(), bytes = op.count * es;
  Buffers mine;
  shared_buffers::find(op.send, bytes, mine.send);
  shared_buffers::find(op.recv, bytes, mine.recv);
  std::vector<Buffers> theirs(static_cast<std::size_t>(n));
  x.swap_with_all(kDescriptorStep, &mine, theirs.data(), sizeof(Buffers));

  std::vector<const std::byte*> in(static_cast<std::size_t>(n));
  std::vector<std::byte*> out(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) {
    in[p] = p == me ? static_cast<const std::byte*>(op.send) : shared_buffers::map(theirs[p].send, bytes);
    out[p] = p == me ? static_cast<std::byte*>(op.recv) : shared_buffers::map(theirs[p].recv, bytes);
  }
  // Chunk `me`, block by block: reduce into this rank's output, then copy
  // the block, still in cache, into every peer's output. This rank's own
  // input goes first: in place it is the output, read before it is written.
  std::vector<int> order{me};
  for (int p = 0; p < n; ++p)
    if (p != me) order.push_back(p);
  const ChunkLayout layout{op.count, n};
  const std::size_t block = std::max<std::size_t>(1, kBlockBytes / es);
  const std::size_t first = layout.offset(me), count = layout.count_of(me);
  for (std::size_t done = 0; done < count; done += block) {
    const std::size_t elems = std::min(block, count - done), at = (first + done) * es;
    std::byte* acc = out[me] + at;
    kernels::cpu::reduce(acc, in[order[0]] + at, in[order[1]] + at, elems, op.dtype, op.reduce_op);
    for (int k = 2; k < n; ++k) kernels::cpu::reduce(acc, acc, in[order[k]] + at, elems, op.dtype, op.reduce_op);
    if (op.reduce_op == ReduceOp::avg) kernels::cpu::divide(acc, elems, op.dtype, n);
    for (int p = 0; p < n; ++p)
      if (p != me) std::memcpy(out[p] + at, acc, elems * es);
  }
  // Every output is complete once every rank has written its chunk.
  std::uint8_t token = 1;
  std::vector<std::uint8_t> tokens(static_cast<std::size_t>(n));
  x.swap_with_all(kDescriptorStep + 1, &token, tokens.data(), 1);
}

}  // namespace braid::comm
