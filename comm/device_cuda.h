// Private (CUDA builds): what the device path's pieces share: CUDA errors
// as braid errors, a scope that makes a device current, the bounded waits
// for an event (comm/device_cuda.cc, comm/device_reducer_cuda.cc,
// comm/transport/cuda_ipc/), and the device Reducer's factory.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "comm/algorithms/reducer.h"
#include "comm/device_gate.h"
#include "comm/types.h"

namespace braid::comm {

// Throws SystemError("CUDA: <what>: <CUDA's text>") unless `status` is success.
void check_cuda(cudaError_t status, const std::string& what);

// Makes `device` current for a scope and restores the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

// Waits until `event` (null: nothing to wait for) has completed, polling
// with sleeps of an eighth of the time waited so far, 5 us to 100 us, at a
// timer slack of 1 us (PollPause, comm/poll_pause.h): the waiting thread
// must not spin on a shared core, and a collective on device memory waits
// so for its inputs and its kernels, so a longer sleep would add to every
// call (under gate `host` the kernels are waited for with a wake-up
// besides: comm/device_reducer_cuda.cc).
// TimeoutError "<what> within BRAID_TIMEOUT" at `deadline`; SystemError on
// a CUDA error.
void wait_for_event(cudaEvent_t event, Clock::time_point deadline, const char* what);

// The same wait, woken: a host function queued on the event's stream right
// after it (cudaLaunchHostFunc) wakes the waiting thread once the stream
// gets there (on the H200: 33 us after a kernel of nothing, where a
// sleep-poll at the default 50 us timer slack took 69 us, and 354 us after
// one of 250 us, where it took 310). The wait still ends on
// cudaEventQuery alone and polls every 100 us meanwhile, so a wake-up late
// or lost costs only wait_for_event's latency, never a result. The host
// function holds its own reference to what it sets, so it may run after
// the StreamWake is gone (a wait that timed out).
//
// Used where the gate is `host` (comm/device.h; also `auto` once it has
// turned to `host`, though there the Reducer polls): under the other gates a
// caller's thread may be blocked in a copy to pageable memory behind a
// gate, holding a driver lock that cudaEventDestroy and cudaStreamCreate
// were seen to wait on (issue 19); whether cudaLaunchHostFunc does is not
// known yet, and under `host` no stream waits for the engine.
class StreamWake {
 public:
  // Queues the host function on `stream`; where CUDA refuses (the error
  // cleared: it is not sticky), wait() polls as wait_for_event does, as it
  // does without queue(). The process's first host function may start the
  // driver's callback thread: the Reducer queues one on the caller's
  // thread, before any collective.
  void queue(cudaStream_t stream);
  // Until `event`, recorded on that stream before queue(), has completed.
  // Throws as wait_for_event.
  void wait(cudaEvent_t event, Clock::time_point deadline, const char* what);

 private:
  struct Flag;
  std::shared_ptr<Flag> flag_;  // null: nothing queued
};

// Gate `event` (comm/device.h): this process's CUDA IPC events, which its
// peers open to wait for them on their streams, and the peers' events
// opened here, by their handles' bytes (DeviceEventRef). One per
// communicator's device path; thread-safe. The peers' events are opened on
// the engine's thread (a worker's first wait for a rank's input), which is
// safe where no stream of this process waits at a gate: gate `event` queues
// none, and the gates of the calls before it opened in order before it ran.
class EventBook {
 public:
  struct Own {
    cudaEvent_t event = nullptr;
    DeviceEventRef ref;
  };
  // Null where the device cannot share events between processes
  // (cudaDevAttrIpcEventSupport).
  static std::shared_ptr<EventBook> make(int device);
  explicit EventBook(int device) : device_(device) {}
  ~EventBook();
  EventBook(const EventBook&) = delete;
  EventBook& operator=(const EventBook&) = delete;
  // An event of this process that peers can open: a spare one or a new one.
  // Back to the spares once no peer waits for its last record any more.
  Own take();
  void give_back(const Own& own);
  // The event `ref` names: one of this book's, or a peer's, opened the
  // first time it is seen (cudaIpcOpenEventHandle). SystemError where CUDA
  // refuses.
  cudaEvent_t find(const DeviceEventRef& ref);

 private:
  int device_;
  std::mutex mu_;
  using Key = std::array<std::uint8_t, sizeof(DeviceEventRef::bytes)>;  // the handle's bytes
  static Key key_of(const DeviceEventRef& ref);
  std::map<Key, cudaEvent_t> own_, opened_;
  std::vector<Own> spare_;
};

// Gate `flag` (comm/device.h): this process's block of flags for one
// communicator (device memory, zeroed, shared through CUDA IPC: the peers'
// flag kernels write into it) and the peers' blocks, opened here the first
// time their handles are seen. One per communicator's device path;
// thread-safe. Opened on the thread that runs the call, as the cuda_ipc
// transport opens the peers' buffers.
class FlagBook {
 public:
  // SystemError where the device refuses the block or its handle.
  explicit FlagBook(int device);
  ~FlagBook();
  FlagBook(const FlagBook&) = delete;
  FlagBook& operator=(const FlagBook&) = delete;
  // This block's handle with a call's number (Op::seq).
  DeviceFlagsRef ref(std::uint64_t call) const;
  // Every rank's block as this rank's kernels address it; SystemError
  // where CUDA refuses a peer's handle, InvalidUsage past kMaxFlagRanks.
  FlagBlocks blocks(std::span<const DeviceFlagsRef> flags, int me);

 private:
  int device_;
  std::uint64_t* block_ = nullptr;
  DeviceFlagsRef own_;
  std::mutex mu_;
  using Key = std::array<std::uint8_t, sizeof(DeviceFlagsRef::block)>;
  std::map<Key, std::uint64_t*> opened_;
};

// What the device Reducer needs of gate `flag`: the book (null: the gate
// is never `flag`), the host-mapped word a flag kernel that gives up sets
// (the gate's, so results_ready() reports it), and how long a kernel waits.
struct FlagWaits {
  std::shared_ptr<FlagBook> book;
  std::uint32_t* timed_out = nullptr;
  std::uint64_t timeout_ns = 0;
};

// DeviceStaging::make_reducer's (comm/device_reducer_cuda.cc); `wake`:
// its kernels are waited for with a StreamWake (gate `host`); `events`
// (null where the device has none): where its done_event comes from and
// the ranks' `ready` events are looked up (Reducer::wait_for); `flags`:
// Reducer::order_by_flags's.
std::unique_ptr<Reducer> make_device_reducer(int device, bool wake, std::shared_ptr<EventBook> events,
                                             FlagWaits flags);

}  // namespace braid::comm
