// What the direct collectives share (DESIGN.md "Registered regions").
//
// When every rank's buffers lie in registered memory that this rank can map
// (host memory from Communicator::allocate through shm; CUDA device memory
// through cuda_ipc), a collective needs no transport ring: each rank reads
// its peers' buffers and writes into them in place. Every direct collective
// is three phases:
//
//   open_direct    swap references to the buffers each rank's call uses
//                  (one small message each way, which also says "my input
//                  is ready") and map the peers' through the Exchange;
//   this rank's share, as Reducer steps (reducer.h) on the mapped buffers:
//                  each byte of output is written once, by one rank;
//   close_direct   wait for this rank's steps, then tell every rank "my
//                  share is written" and hear the same from each: every
//                  output is complete once every rank's share is.
//
// References are opaque here: the transport that maps a peer's reference
// checks it against what that peer registered. The swap uses a step number
// no other algorithm uses, so a rank that took another algorithm fails with
// a header mismatch naming both calls instead of mixing protocols; since
// every rank hears from every other before anything is mapped or written,
// the swap is also the signature agreement (Algorithm::agrees).
#pragma once

#include <cstddef>
#include <vector>

#include "comm/algorithms/exchange.h"

namespace braid::comm {

inline constexpr std::uint32_t kDirectStep = 0x7fff0000u;

// Every rank's buffers as this rank addresses them: its own, and the peers'
// mapped here. Null where that rank's call does not use the buffer (a
// broadcast's send buffer off the root, a reduce's receive buffer).
struct DirectBuffers {
  std::vector<const std::byte*> send;  // [rank]
  std::vector<std::byte*> recv;        // [rank]
};

// InvalidUsage when a buffer this rank's call uses is not registered memory
// the transport can hand its peers; RemoteError when a peer's reference
// does not name what it registered (Exchange::peer_region).
DirectBuffers open_direct(Exchange& x);
void close_direct(Exchange& x);

// Ranks in the order their inputs are reduced: this rank first (in place,
// its input is the output the host Reducer accumulates into), then the rest.
std::vector<int> this_rank_first(int rank, int size);

// One step through x.reducer(): `reduces` with the call's op (and divides
// for avg), else a copy of the one source.
void direct_step(Exchange& x, const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                 std::size_t count, bool reduces);

}  // namespace braid::comm
