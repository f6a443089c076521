// Direct all-reduce over registered memory (DESIGN.md "Registered regions").
//
// When every rank's send and receive buffers lie in registered memory that
// the transport to every peer can map (Communicator::allocate on one host),
// no transport ring is needed: the ranks swap references to their buffers
// (a small message each way, which also says "my input is ready"), map each
// other's through the transport, and rank r reduces chunk r of every input
// straight into chunk r of every output, in blocks that stay in L1/L2
// between the reduce and the copies out. A second message round says "your
// output is written". Each byte is read once and written once: half the
// memory traffic of the ring over shared-memory rings.
//
// The references are opaque to this file: the transport that maps a peer's
// reference checks it against what that peer registered. The reference
// messages use a step number no other algorithm uses, so a rank that took
// another algorithm (its buffers were not registered) fails with a header
// mismatch naming both calls instead of mixing protocols; since every rank
// hears from every other before anything is mapped or written, the swap is
// also the signature agreement (Algorithm::agrees).
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "kernels/cpu/reduce.h"
#include "runtime/errors.h"

namespace braid::comm {
namespace {

constexpr std::uint32_t kReferenceStep = 0x7fff0000u;
constexpr std::size_t kBlockBytes = 32u << 10;

struct Buffers {
  RegionRef send, recv;
};

}  // namespace

void all_reduce_direct(Exchange& x) {
  const Op& op = x.op();
  const int n = x.size(), me = x.rank();
  const std::size_t es = x.element_bytes(), bytes = op.count * es;
  Buffers mine;
  if (!x.find_region(op.send, bytes, mine.send) || !x.find_region(op.recv, bytes, mine.recv))
    throw InvalidUsage(describe(op) + ": the direct all-reduce needs registered send and receive buffers");
  std::vector<Buffers> theirs(static_cast<std::size_t>(n));
  x.swap_with_all(kReferenceStep, &mine, theirs.data(), sizeof(Buffers));

  std::vector<const std::byte*> in(static_cast<std::size_t>(n));
  std::vector<std::byte*> out(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) {
    in[p] = p == me ? static_cast<const std::byte*>(op.send) : x.peer_region(p, theirs[p].send, bytes).data();
    out[p] = p == me ? static_cast<std::byte*>(op.recv) : x.peer_region(p, theirs[p].recv, bytes).data();
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
  x.swap_with_all(kReferenceStep + 1, &token, tokens.data(), 1);
}

}  // namespace braid::comm
