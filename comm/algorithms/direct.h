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
//                  is ready") and map the peers' through the Exchange
//                  (a rank that does no share maps none);
//   the shares, as Reducer steps (reducer.h) on the mapped buffers: each
//                  rank's share is its part of the output (its chunk, or
//                  what its input becomes), each byte written once, by one
//                  step;
//   close_direct   wait for this rank's steps, then tell every rank "my
//                  share is written" and hear the same from each: every
//                  output is complete once every rank's share is.
//
// Stream order (gate `event` on device memory, comm/device.h): where every
// rank's swap carries the event recorded on its stream after its input
// (DirectSwap::ready), no host waits for the GPU. A worker's steps wait
// for every rank's `ready` on the device (Reducer::wait_for; a rank whose
// swap has none waited on the host before it sent it), and close_direct
// says "my share is queued behind my `done` event" instead of "written"
// (Reducer::finish_queued): every rank's stream then waits for the
// workers' `done` events (Exchange::wait_on_stream) before the work queued
// after the call. The events are reused from call to call, which is safe
// because a rank records its `ready` again only after its previous call,
// and so after every worker queued its wait for it; a worker records its
// `done` again only after every rank's next swap, sent after that rank's
// stream queued its wait for the last one.
//
// Who does the shares (DirectBuffers::shares) is agreed in the swap: each
// rank its own, or rank 0 every one, step for step the same (so the same
// result to the bit) while the others only wait in close_direct. One worker
// is for ranks that take one GPU in turns: their processes' contexts
// time-slice it, so every rank that runs a kernel costs the call a context
// switch, and one worker costs one. Each rank sends its setting
// (Config::direct_workers) and its buffers' GPU; the rule of
// one_direct_worker is a function of every rank's pair, so every rank
// reaches the same answer. select.cc still chooses the algorithm (the same
// either way); who runs its steps is agreed here because the answer needs
// every rank's GPU, which only the swap brings.
//
// Stream order by flags (gate `flag` on device memory, comm/device.h):
// where every rank's swap carries its block of flags and the same call
// number (DirectSwap::flags), no event crosses between processes and no
// host waits for the GPU. After the swap each rank queues on its own
// caller's stream (Reducer::order_by_flags) a one-thread kernel that tells
// every rank "my stream has reached this call" (so my input is written and
// my output free) and waits until every rank has said so; then this rank's
// steps, on that stream; then (close_direct, Reducer::finish_flagged) one
// that tells every rank "my share is written" and waits to hear it from
// all. The caller's stream needs no other wait: the work queued after the
// call follows the last kernel. A call's number is its collective sequence
// number (Op::seq, the same on every rank), and a kernel waits for at least
// its call's number, so a rank ahead never confuses one behind, and calls
// that some rank did not flag-order only leave gaps. A rank's numbers only
// grow on the GPU too: a call on another stream than the one before waits
// there for that one's end (device_reducer_cuda.cc), so no later call of
// this rank announces its input while an earlier one still waits. Where some ranks'
// swaps carry flags and others' do not (gates that differ by rank), the
// ranks with flags wait for their input on the host and every rank waits
// for that at a barrier before any step reads a peer's buffer; the call
// then ends as an unordered one does.
//
// References are opaque here: the transport that maps a peer's reference
// checks it against what that peer registered. The swap uses a step number
// no other algorithm uses, so a rank that took another algorithm fails with
// a header mismatch naming both calls instead of mixing protocols; since
// every rank hears from every other before anything is mapped or written,
// the swap is also the signature agreement (Algorithm::agrees).
#pragma once

#include <cstddef>
#include <span>
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
  // The ranks whose share this rank does: itself, or with one worker every
  // rank on rank 0 and none on the others.
  std::vector<int> shares;
  // Every rank's swap carried its `ready` event: the steps wait on the
  // device, and the results are waited for there (close_direct).
  bool stream_ordered = false;
  std::vector<DeviceEventRef> done;  // [rank] each rank's worker event
  // Every rank's swap carried its flags with this call's number (gate
  // `flag`): the steps run on the caller's stream between the flag waits.
  bool flag_ordered = false;
};

// What each rank says of the workers in the swap: its setting and the GPU
// its buffers are on (zeros: host memory).
struct WorkerVote {
  std::uint8_t device[16] = {};
  DirectWorkers workers = DirectWorkers::automatic;
};

// What a rank tells its peers in open_direct's swap: references to the
// buffers its call uses (zero where it uses none; a peer never maps those)
// and its vote.
struct DirectSwap {
  RegionRef send, recv;
  WorkerVote vote;
  // Stream order: the event on this rank's stream after its input (unset:
  // the input was waited for on the host), and the event its Reducer
  // records after its steps (Reducer::done_event).
  DeviceEventRef ready, done;
  // Stream order by flags: this rank's block and the call's number (unset:
  // its input was or will be waited for on the host).
  DeviceFlagsRef flags;
};

// Whether rank 0 does every share, from every rank's swap: never where some
// rank asks for all; where every rank asks for one; otherwise (some
// automatic, none all) where every rank's buffers are on the same GPU.
bool one_direct_worker(std::span<const DirectSwap> swapped);

// Whether another rank's buffers are on the GPU that rank `me`'s are on:
// their processes then take that GPU in turns (BRAID_CUDA_GATE=auto, comm/device.h).
bool peer_on_this_gpu(std::span<const DirectSwap> swapped, int me);

// InvalidUsage when a buffer this rank's call uses is not registered memory
// the transport can hand its peers; RemoteError when a peer's reference
// does not name what it registered (Exchange::peer_region).
DirectBuffers open_direct(Exchange& x);
void close_direct(Exchange& x, const DirectBuffers& b);

// Whether every rank's swap carries its `ready` event (stream order).
bool stream_ordered(std::span<const DirectSwap> swapped);
// Whether every rank's swap carries its flags (stream order by flags);
// RemoteError where they do with different call numbers (the ranks' flag
// calls out of step: a stream would wait for a call its peer never makes).
bool flag_ordered(std::span<const DirectSwap> swapped);

// Ranks in the order their inputs are reduced: this rank first (in place,
// its input is the output the host Reducer accumulates into), then the rest.
std::vector<int> this_rank_first(int rank, int size);

// One step through x.reducer(): `reduces` with the call's op (and divides
// for avg), else a copy of the one source.
void direct_step(Exchange& x, const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                 std::size_t count, bool reduces);

}  // namespace braid::comm
