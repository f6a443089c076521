// Private: calls on CUDA device memory, staged through pinned host memory.
//
// A call on device buffers becomes, on the caller's stream, in issue order:
//
//   copy the send buffer to pinned host staging      (device -> host)
//   record `staged`
//   the gate: a one-thread kernel that waits until the host opens it
//   copy the result from staging to the receive buffer (host -> device)
//   record `finished`
//
// and on the engine's thread: wait (bounded) for `staged`, run the host
// algorithm over the staging buffers on any transport, open the gate. So the
// call starts after the work queued before it on the stream, the work queued
// after it waits for its result (NCCL's stream semantics), and the caller's
// thread never blocks. The gate is a counter in mapped pinned memory that
// only grows: tickets are handed out in issue order and opened in the same
// order, success or failure, so no stream waits for ever; the kernel also
// gives up after the communicator's timeout plus a margin and says so.
//
// This is the path across hosts (TCP) and the fallback for every transport.
//
// A collective (all but send / recv) among ranks of one host
// (BRAID_TRANSPORT=auto) whose buffers CUDA IPC can share (select.cc decides) runs on the device
// instead: the stream gets only the `ready` event and the gate; the engine
// waits for `ready`, the ranks swap IPC handles of their buffers (small host
// messages), each rank runs its share as kernels over the peers' mapped
// buffers (kernels::cuda::reduce_multi; for all_reduce one fused kernel
// over its chunk that reads every rank's input and writes every rank's
// output), then a barrier, then the gate opens. Every byte is read once and
// written once: the least traffic these collectives can make. This departs from
// DESIGN.md's transport-with-views for CUDA IPC: the peers' buffers are
// mapped directly, with no transport ring in between.
// If one rank takes this path and another cannot (a buffer IPC cannot share,
// e.g. from cudaMallocAsync), their first messages differ in size and both
// fail with the header mismatch naming the two calls.
#pragma once

#include <chrono>
#include <memory>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/exchange.h"
#include "comm/types.h"

namespace braid::comm {

// One staged call. Shared by the engine and the Work.
class StagedOp {
 public:
  virtual ~StagedOp() = default;
  // Engine, before the algorithm: until the stream has copied the inputs out.
  // Throws TimeoutError at `deadline`, SystemError on a CUDA error (also one
  // recorded while the call was staged).
  virtual void wait_inputs(Clock::time_point deadline) = 0;
  // Engine, after the algorithm whatever its outcome; once only.
  virtual void open_gate() = 0;
  // Whether the result is back in device memory; throws if the gate timed out.
  virtual bool results_ready() = 0;
  // Work::wait: until results_ready(), at most until `deadline`.
  virtual void wait_results(Clock::time_point deadline) = 0;
  // The CUDA IPC path: the engine calls run_on_device instead of the host
  // algorithm (after wait_inputs, before open_gate).
  virtual bool on_device() const { return false; }
  virtual void run_on_device(Exchange& x) { (void)x; }
};

// One per communicator and device, created on its first call on device memory.
class DeviceStaging {
 public:
  virtual ~DeviceStaging() = default;
  // Caller's thread, in issue order: queues the copies and the gate on
  // op.stream and points op.send / op.recv at the staging buffers (in-place
  // calls stay in place). `rank` and `size` give the buffers' extents.
  // Whether the call runs on the device over mapped peers (cuda_ipc) or is
  // staged is select.cc's answer for `shape`, once the staging has said
  // whether it can map every peer's buffers.
  virtual std::shared_ptr<StagedOp> stage(Op& op, int rank, int size, CallShape shape) = 0;
};

// Throws InvalidUsage without CUDA support, SystemError when the device
// cannot be used (no driver, no such device).
std::unique_ptr<DeviceStaging> make_device_staging(int device, std::chrono::milliseconds timeout);

// Elements in op's send and receive buffers on `rank`, 0 for a buffer the
// call does not use there (a broadcast's send buffer off the root, ...).
std::size_t send_elements(const Op& op, int rank, int size);
std::size_t recv_elements(const Op& op, int rank, int size);

}  // namespace braid::comm
