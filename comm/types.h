// comm/'s private vocabulary: the descriptor every call builds, where a
// receive is written, and references into registered memory. The public part
// (DataType, ReduceOp, OpKind, Stream) is include/braid/types.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "braid/types.h"
#include "runtime/device.h"

namespace braid::comm {

// How a receive's payload is written into the caller's buffer, where the
// transport copies it itself: `streamed` uses non-temporal stores, for
// memory the caller will not read again soon (the last step of an
// out-of-place all-gather), sparing its read-for-ownership.
enum class Placement : std::uint8_t { cached, streamed };

// One collective call, as validated and queued. Counts follow NCCL:
//   all_reduce, broadcast, reduce, send, recv: `count` elements in each buffer;
//   reduce_scatter: recv has `count`, send has size*count;
//   all_gather: send has `count`, recv has size*count;
//   all_to_all: `count` per peer, both buffers size*count.
// `root` is the root of broadcast/reduce and the peer of send/recv, else -1.
struct Op {
  OpKind kind = OpKind::barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::f32;
  ReduceOp reduce_op = ReduceOp::sum;
  int root = -1;
  std::uint64_t seq = 0;  // position in this communicator's issue order, from 1
  // Where the caller's buffers live (validate() sets it), and the stream of
  // a call on device memory.
  runtime::Location memory;
  Stream stream;
  // An avg of f16 or bf16 on host memory whose inputs were scaled down by
  // 2^-avg_scale_up before the sum (communicator.cc: scale_avg_inputs):
  // the algorithm's divide by the ranks scales each quotient back up
  // (kernels::cpu::divide's scale_up). 0 elsewhere.
  int avg_scale_up = 0;
  // With avg_scale_up: the inputs were left as they are, and the algorithm
  // (the ring: Algorithm::scales_avg_inputs) scales each element down as it
  // reads it, rounded as the copy would have rounded it.
  bool avg_inputs_unscaled = false;
  // The algorithm that runs the call (algorithm_id, below, of select.cc's
  // choice), set by the engine before it runs the call: every message
  // carries it, so ranks that chose differently (BRAID_ALGO, registered
  // buffers) are told so. 0 for point-to-point calls.
  std::uint8_t algorithm = 0;
  // A send or receive: the number the first collective issued after it
  // gets (exchange_slots.cc: check_receive).
  std::uint64_t next_collective = 0;
  // all_gather into one buffer per rank (Communicator::all_gather's list
  // form): rank r's part lands at recv_chunks[r] (size pointers), recv is
  // null. Null in every other call.
  void* const* recv_chunks = nullptr;
  // reduce_scatter from one buffer per rank (Communicator::reduce_scatter's
  // list form): the input for rank r's part is at send_chunks[r] (size
  // pointers), send is null. Null in every other call.
  const void* const* send_chunks = nullptr;
};

// The root of the all_gather by which split() exchanges every rank's color
// and key. It is part of the call's signature, so a peer that called an
// all_gather of the same shape (2 x i64) instead is told apart, where it
// took split's colors and keys for its result.
inline constexpr int kSplitRoot = -2;

// "all_reduce #12 (count 1024, f32, sum)"
std::string describe(const Op& op);
// For a mismatch of algorithms in an all_gather or a reduce_scatter: that
// its list form (Op::recv_chunks, Op::send_chunks) never runs direct, so
// ranks that pass the flat form on registered buffers under
// BRAID_ALGO=direct disagree with it. Empty for other kinds.
std::string list_form_note(OpKind kind);

// The number of a select.cc algorithm name, as Op and the headers carry it:
// 1 up to kAlgorithmIds - 1; cuda_ipc is direct's (the same collectives over
// device buffers); 0 for a name it does not know (point-to-point calls).
inline constexpr std::uint8_t kAlgorithmIds = 9;
std::uint8_t algorithm_id(std::string_view name);
// The name of an algorithm number ("algorithm 12" for an unknown one).
std::string algorithm_name(std::uint8_t id);

// A buffer in registered memory (Communicator::allocate; DESIGN.md
// "Registered regions"), as a peer's transport needs it: the owning
// transport's key for the region and the buffer's place in it. Algorithms
// only pass it on (Exchange::find_region / peer_region); the transport that
// receives it checks key, offset and bytes against what the owner really
// registered before it touches a byte.
struct RegionRef {
  std::uint64_t key[2] = {0, 0};  // shm: the memfd's number and inode in the owner's process
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

// A CUDA event that other processes of this host may wait for on their
// streams (the bytes of its cudaIpcEventHandle_t; all zeros: none), as the
// direct collectives pass them around under gate `event` (comm/device.h).
// Opaque outside the device path, like RegionRef.
struct DeviceEventRef {
  std::uint8_t bytes[64] = {};
  bool set() const {
    for (std::uint8_t b : bytes)
      if (b) return true;
    return false;
  }
};

// Gate `flag` (comm/device.h): where a rank's stream and its peers' wait for
// each other, a block of flags in that rank's device memory (the bytes of
// its cudaIpcMemHandle_t), and the call's number: its collective sequence
// number, Op::seq, from 1 (0: the call is not flag-ordered). Opaque
// outside the device path, like DeviceEventRef.
struct DeviceFlagsRef {
  std::uint8_t block[64] = {};
  std::uint64_t call = 0;
  bool set() const { return call != 0; }
};

}  // namespace braid::comm
