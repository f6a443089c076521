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
// A collective whose buffers every rank of one host shares through CUDA IPC
// (comm/transport/cuda_ipc/; select.cc decides) runs on the device instead:
// the stream gets only the `staged` event, the gate and the `finished`
// event, and no copies; the engine waits for `staged`, runs the direct
// collective (comm/algorithms/<kind>_direct.cc) over the peers' mapped
// buffers with the device Reducer below (kernels::cuda::reduce_multi on a
// stream of its own, waited for before the collective's closing barrier),
// then opens the gate. Every byte is read once and written once: the least
// traffic these collectives can make. If one rank takes this path and
// another cannot (a buffer IPC cannot share, e.g. from cudaMallocAsync),
// their first messages differ and both fail with the header mismatch
// naming the two calls.
//
// BRAID_CUDA_GATE=host (Config::cuda_gate) queues no gate: the call holds
// its caller's thread until it has run (in that thread where the engine is
// idle, else on the engine's), and only then queues the copy of the result
// back (staged calls). The stream holds nothing
// while the collective runs, so the GPU has no waiting work of this
// process: ranks that share a GPU then need not time-slice it (every other
// gate keeps a kernel resident or a front-end wait pending in each rank's
// context). The caller's thread waits as Work::wait does.
//
// BRAID_CUDA_GATE=event is `host` for staged calls; a direct collective
// holds its caller only until every rank's kernels are queued, and no host
// waits for the GPU: the call's stream records an interprocess event
// (`ready`, EventBook, comm/device_cuda.h) that the workers' Reducer
// streams wait for before their kernels, and once the engine has run the
// call the caller's thread queues on its stream the waits for the workers'
// `done` events and then `finished` (comm/algorithms/direct.h, "Stream
// order"). So the next call's host work overlaps this one's kernels. Under
// MPS (every rank's work in one context) that took a 2-rank 256 MiB
// all_reduce on an H200 from 0.37 ms (gate `host`) to 0.28 ms, where its
// kernel alone takes 0.26; without MPS a stream that waits for another
// process's event keeps its context on the GPU, and it took 0.58 ms.
//
// BRAID_CUDA_GATE=flag is `host` for staged calls and sends and receives;
// a direct collective holds its caller only until every rank's kernels are
// queued, and its steps run on the caller's stream between two one-thread
// kernels that wait for flags the other ranks' kernels set in this rank's
// device memory (comm/algorithms/direct.h, "Stream order by flags"). No
// event crosses between processes and the Reducer's stream is not used, so
// a call costs its kernel and two hand-offs of about a microsecond: under
// MPS on an H200, a 2-rank 256 MiB all_reduce in 0.267 ms where its kernel
// alone takes 0.26 and the event gate took 0.28 (0.493-0.497 of the copy
// bandwidth against 0.473-0.479; 4 ranks 0.374-0.376, the bound 0.375).
// Calls on the legacy default stream (a null Stream) run there too.
// Without MPS the kernels that wait hold their context on the GPU, which
// other processes then get only in time slices: use it under MPS. A wait
// gives up after BRAID_TIMEOUT plus a margin, as the gate kernel does.
//
// BRAID_CUDA_GATE=auto (the default) is `kernel` until a direct collective
// finds a peer's buffers on this rank's GPU (ExchangeContext::gpu_shared),
// then `flag` under MPS (cudaDevAttrMpsEnabled) and `host` without, for
// every later call: on an H200 shared by 2 ranks a 256 MiB all_reduce took
// 4.16 ms with the gate kernels and 0.33 ms with the host gate, and tp 2
// training ran 4.5 times faster (README.md, "Device memory"); under MPS,
// 0.27 ms with the flag gate against 0.28 with the event gate. Ranks with a
// GPU each keep the gate kernel and so their callers' asynchrony. Calls of
// every kind mix freely: a held call takes no ticket, the gates still open
// in order, and a direct collective runs in stream order only where every
// rank's call does (a worker waits for the inputs of the others on the
// device all the same; a rank whose call has flags while a peer's has none
// waits for its input on the host, and every rank for that, before any
// step: comm/algorithms/direct.h).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/exchange.h"
#include "comm/algorithms/reducer.h"
#include "comm/transport/cuda_ipc/transport.h"
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
  // Whether the call runs on its device buffers (a direct collective over
  // the peers' buffers mapped through CUDA IPC) rather than on staging.
  virtual bool on_device() const { return false; }
  // Whether the caller's thread waits for the call (gate `host`); then it
  // calls finish_on_caller once the engine ran the call without error:
  // queues the result's copy back to device memory. Throws SystemError.
  virtual bool holds_caller() const { return false; }
  virtual void finish_on_caller() {}
  // Gate `event`: the event recorded on the caller's stream after the work
  // before the call (unset otherwise: wait_inputs waited for it on the
  // host), and, from the engine after the call ran without error, the
  // events the caller's stream waits for (the workers' `done`), queued by
  // finish_on_caller before the work after the call.
  virtual DeviceEventRef ready_event() const { return {}; }
  virtual void wait_on_stream(std::vector<DeviceEventRef> events) { (void)events; }
  // Gate `flag`: this rank's flags for the call numbered `call` (its
  // Op::seq, the same on every rank whatever gate each rank's call took;
  // unset where the call is not flag-ordered: wait_inputs waited on the
  // host), and the host's wait for the input where the peers' calls turn
  // out not to be flag-ordered (direct.h).
  virtual DeviceFlagsRef flags(std::uint64_t call) const { (void)call; return {}; }
  virtual void wait_inputs_on_host(Clock::time_point deadline) { (void)deadline; }
};

// One per communicator and device, created on its first call on device memory.
class DeviceStaging {
 public:
  virtual ~DeviceStaging() = default;
  // Caller's thread, in issue order: queues the copies and the gate on
  // op.stream and points op.send / op.recv at the staging buffers (in-place
  // calls stay in place). `rank` and `size` give the buffers' extents.
  // Whether the call runs on the device buffers (cuda_ipc) or is staged is
  // select.cc's answer for `shape` (its `registered`: every buffer the call
  // uses here is shareable through CUDA IPC).
  virtual std::shared_ptr<StagedOp> stage(Op& op, int rank, int size, const CallShape& shape) = 0;
  // Caller's thread, before stage: a peer's process uses this GPU too
  // (gate `auto` holds the caller from this call on).
  virtual void note_gpu_shared() {}
  // Whether this process's context on the device is an MPS client's
  // (every rank's work in one context, no time-slicing).
  virtual bool mps() const { return false; }

  // The rest of the device path, made here so that everything that calls
  // CUDA comes from this one factory: the Reducer of the direct collectives
  // on this device's memory (kernels::cuda::reduce_multi on a stream of its
  // own, comm/device_reducer_cuda.cc), and cuda_ipc, the transport that
  // makes device memory of the ranks of this host registered regions
  // (comm/transport/cuda_ipc/transport.h).
  virtual std::unique_ptr<Reducer> make_reducer() = 0;
  // The device's UUID: the same bytes in every process that uses this GPU,
  // whatever its ordinal there (ExchangeContext::device_id).
  virtual std::array<std::uint8_t, 16> device_uuid() = 0;
  virtual std::unique_ptr<Transport> connect_regions(std::shared_ptr<runtime::Store> store,
                                                     const std::string& key_prefix,
                                                     const cuda_ipc::CudaIpcOptions& options) = 0;
};

// Throws InvalidUsage without CUDA support or for a `gate` that is not
// "auto", "kernel", "wait", "host", "event" or "flag" (Config::cuda_gate),
// SystemError when the device cannot be used (no driver, no such device;
// "event" where it cannot share events between processes).
std::unique_ptr<DeviceStaging> make_device_staging(int device, std::chrono::milliseconds timeout,
                                                   const std::string& gate);

}  // namespace braid::comm
