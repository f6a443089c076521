// comm/device.h on the CUDA runtime (CUDA builds only): staging through
// pinned host memory and the stream gate, and the helpers of
// comm/device_cuda.h. The direct collectives' device work is
// comm/device_reducer_cuda.cc; the peers' memory, comm/transport/cuda_ipc/
// (this factory hands both out, so the device path has one entry point).
#include "comm/device_cuda.h"

#include <cuda.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/device.h"
#include "comm/device_gate.h"
#include "comm/poll_pause.h"
#include "kernels/cuda/reduce.h"
#include "runtime/errors.h"

namespace braid::comm {

void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw SystemError("CUDA: " + what + ": " + cudaGetErrorString(status));
}

DeviceScope::DeviceScope(int device) {
  check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
}

DeviceScope::~DeviceScope() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

namespace {

// Queries `event` until it has completed, calling `pause` between queries.
template <class Pause>
void poll_event(cudaEvent_t event, Clock::time_point deadline, const char* what, Pause pause) {
  for (;;) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) check_cuda(status, what);
    if (Clock::now() >= deadline) throw TimeoutError(std::string(what) + " within BRAID_TIMEOUT");
    pause();
  }
}

}  // namespace

void wait_for_event(cudaEvent_t event, Clock::time_point deadline, const char* what) {
  if (!event) return;
  PollPause pause;
  poll_event(event, deadline, what, [&] { pause(); });
}

struct StreamWake::Flag {
  std::mutex mu;
  std::condition_variable cv;
  bool fired = false;

  // On CUDA's callback thread: no CUDA calls here.
  static void CUDART_CB fire(void* data) {
    const std::unique_ptr<std::shared_ptr<Flag>> self(static_cast<std::shared_ptr<Flag>*>(data));
    Flag& flag = **self;
    {
      std::lock_guard lock(flag.mu);
      flag.fired = true;
    }
    flag.cv.notify_all();
  }
};

void StreamWake::queue(cudaStream_t stream) {
  auto flag = std::make_shared<Flag>();
  auto* reference = new std::shared_ptr<Flag>(flag);
  if (cudaLaunchHostFunc(stream, &Flag::fire, reference) != cudaSuccess) {
    delete reference;
    (void)cudaGetLastError();
    return;
  }
  flag_ = std::move(flag);
}

void StreamWake::wait(cudaEvent_t event, Clock::time_point deadline, const char* what) {
  if (!flag_) return wait_for_event(event, deadline, what);
  bool woken = false;  // the event is done: the next query says so
  poll_event(event, deadline, what, [&] {
    if (woken) return std::this_thread::sleep_for(std::chrono::microseconds(100));  // no spinning regardless
    std::unique_lock lock(flag_->mu);
    woken = flag_->cv.wait_for(lock, std::chrono::microseconds(100), [&] { return flag_->fired; });
  });
}

std::shared_ptr<EventBook> EventBook::make(int device) {
  int supported = 0;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrIpcEventSupport, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return supported ? std::make_shared<EventBook>(device) : nullptr;
}

EventBook::~EventBook() {
  DeviceScope scope(device_);
  for (auto& [bytes, event] : opened_) cudaEventDestroy(event);
  for (auto& [bytes, event] : own_) cudaEventDestroy(event);
}

EventBook::Key EventBook::key_of(const DeviceEventRef& ref) {
  Key key;
  std::memcpy(key.data(), ref.bytes, key.size());
  return key;
}

EventBook::Own EventBook::take() {
  {
    std::lock_guard lock(mu_);
    if (!spare_.empty()) {
      Own own = spare_.back();
      spare_.pop_back();
      return own;
    }
  }
  DeviceScope scope(device_);
  Own own;
  check_cuda(cudaEventCreateWithFlags(&own.event, cudaEventDisableTiming | cudaEventInterprocess),
             "cudaEventCreate (an event other processes wait for)");
  cudaIpcEventHandle_t handle{};
  static_assert(sizeof handle == sizeof own.ref.bytes);
  const cudaError_t status = cudaIpcGetEventHandle(&handle, own.event);
  if (status != cudaSuccess) {
    cudaEventDestroy(own.event);
    check_cuda(status, "cudaIpcGetEventHandle");
  }
  std::memcpy(own.ref.bytes, &handle, sizeof handle);
  if (!own.ref.set()) {  // would read as "no event": the peers would not wait for it
    cudaEventDestroy(own.event);
    throw SystemError("CUDA: cudaIpcGetEventHandle gave a handle of zeros");
  }
  std::lock_guard lock(mu_);
  own_.emplace(key_of(own.ref), own.event);
  return own;
}

void EventBook::give_back(const Own& own) {
  if (!own.event) return;
  std::lock_guard lock(mu_);
  spare_.push_back(own);
}

cudaEvent_t EventBook::find(const DeviceEventRef& ref) {
  const Key key = key_of(ref);
  std::lock_guard lock(mu_);
  if (auto it = own_.find(key); it != own_.end()) return it->second;
  if (auto it = opened_.find(key); it != opened_.end()) return it->second;
  DeviceScope scope(device_);
  cudaIpcEventHandle_t handle{};
  std::memcpy(&handle, ref.bytes, sizeof handle);
  cudaEvent_t event = nullptr;
  check_cuda(cudaIpcOpenEventHandle(&event, handle), "cudaIpcOpenEventHandle (a peer's event)");
  opened_.emplace(key, event);
  return event;
}

// The driver packs small allocations into shared 2 MiB pages, and a CUDA
// IPC handle names the page: a peer that opened a small buffer of this
// process could not open a block of flags on the same page ("resource
// already mapped", seen on an H200). So the block has a page of its own.
constexpr std::size_t kFlagPageBytes = 2u << 20;
static_assert(kFlagBlockBytes <= kFlagPageBytes);

FlagBook::FlagBook(int device) : device_(device) {
  DeviceScope scope(device_);
  void* block = nullptr;
  check_cuda(cudaMalloc(&block, kFlagPageBytes), "cudaMalloc (gate flag's block of flags)");
  block_ = static_cast<std::uint64_t*>(block);
  cudaIpcMemHandle_t handle{};
  static_assert(sizeof handle == sizeof own_.block);
  cudaError_t status = cudaMemset(block_, 0, kFlagBlockBytes);
  if (status == cudaSuccess) status = cudaIpcGetMemHandle(&handle, block_);
  if (status != cudaSuccess) {
    cudaFree(block_);
    check_cuda(status, "sharing gate flag's block of flags (cudaIpcGetMemHandle)");
  }
  std::memcpy(own_.block, &handle, sizeof handle);
}

FlagBook::~FlagBook() {
  DeviceScope scope(device_);
  for (auto& [key, block] : opened_) cudaIpcCloseMemHandle(block);
  cudaFree(block_);
}

DeviceFlagsRef FlagBook::ref(std::uint64_t call) const {
  DeviceFlagsRef ref = own_;
  ref.call = call;
  return ref;
}

FlagBlocks FlagBook::blocks(std::span<const DeviceFlagsRef> flags, int me) {
  if (flags.size() > static_cast<std::size_t>(kMaxFlagRanks))
    throw InvalidUsage("gate flag orders at most " + std::to_string(kMaxFlagRanks) + " ranks, not " +
                       std::to_string(flags.size()));
  FlagBlocks b;
  b.n = static_cast<int>(flags.size());
  b.me = me;
  std::lock_guard lock(mu_);
  for (std::size_t r = 0; r < flags.size(); ++r) {
    if (static_cast<int>(r) == me) {
      b.block[r] = block_;
      continue;
    }
    Key key;
    std::memcpy(key.data(), flags[r].block, key.size());
    auto it = opened_.find(key);
    if (it == opened_.end()) {
      DeviceScope scope(device_);
      cudaIpcMemHandle_t handle{};
      std::memcpy(&handle, flags[r].block, sizeof handle);
      void* block = nullptr;
      check_cuda(cudaIpcOpenMemHandle(&block, handle, cudaIpcMemLazyEnablePeerAccess),
                 "cudaIpcOpenMemHandle (rank " + std::to_string(r) + "'s block of flags)");
      it = opened_.emplace(key, static_cast<std::uint64_t*>(block)).first;
    }
    b.block[r] = it->second;
  }
  return b;
}

namespace {

void check(cudaError_t status, const std::string& what) { check_cuda(status, what); }

using WaitValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

// What the staging of one device outlives its communicator with: pinned
// buffers for reuse, and the gate's counter and timeout flag (mapped pinned
// memory the gate kernel reads and writes).
struct Shared {
  int device = 0;
  std::mutex mu;
  std::multimap<std::size_t, void*> free_blocks;
  // Blocks a stream may still copy from or to, with the event after which
  // none does.
  struct Retiring {
    cudaEvent_t done;
    std::vector<std::pair<std::size_t, void*>> blocks;
  };
  std::vector<Retiring> retiring;
  // Events for reuse. The engine thread ends a call's staging, and there
  // cudaEventDestroy waited on a lock held by the caller's thread, itself
  // blocked in a copy behind the gate the engine was to open next (issue 19,
  // cuda-gdb's stacks of test_comm_device). So events go back here, and only
  // the caller's thread (stage()) creates them.
  std::vector<cudaEvent_t> spare_events;
  volatile std::uint64_t* gate = nullptr;  // host view
  std::uint64_t* gate_device = nullptr;
  std::uint32_t* timed_out = nullptr;  // host view; [0] set by a gate that gave up
  std::uint32_t* timed_out_device = nullptr;

  // BRAID_CUDA_GATE=wait: a stream waits at its gate in the GPU's front end
  // (cuStreamWaitValue64 on the counter) instead of in a one-thread kernel.
  // Then no kernel of this process stays resident while it waits, and the
  // ranks sharing a GPU need not time-slice: on an H200, another process's
  // kernel ran 0.45 ms into such a wait, 2.8 ms into a gate kernel
  // (cuda_gate_probe, modes wait and spin). Such a wait cannot give up by
  // itself, so `watch` opens, flagged as timed out, a gate that nobody opened
  // within its limit, counted from when the gate before it opened.
  WaitValue64 wait_value = nullptr;  // set: wait gates
  struct Watch {
    std::mutex mu;
    std::condition_variable cv;
    std::uint64_t queued = 0, opened = 0;
    Clock::time_point since;
    Clock::duration limit{};
    bool stop = false;
    std::thread thread;
  } watch;

  // Opens every gate up to `ticket`. The counter only grows, whoever opens.
  void raise_counter(std::uint64_t ticket) {
    std::atomic_ref<std::uint64_t> counter(*const_cast<std::uint64_t*>(gate));
    std::uint64_t now = counter.load(std::memory_order_relaxed);
    while (now < ticket && !counter.compare_exchange_weak(now, ticket, std::memory_order_release)) {
    }
  }

  void open(std::uint64_t ticket) {
    raise_counter(ticket);
    if (!wait_value) return;
    std::lock_guard lock(watch.mu);
    opened(ticket);
  }

  // Called with watch.mu held: the next gate's limit counts from now.
  void opened(std::uint64_t ticket) {
    if (ticket <= watch.opened) return;
    watch.opened = ticket;
    watch.since = Clock::now();
  }

  void queued(std::uint64_t ticket) {
    if (!wait_value) return;
    std::lock_guard lock(watch.mu);
    if (watch.queued == watch.opened) watch.since = Clock::now();
    watch.queued = ticket;
    watch.cv.notify_one();
  }

  void start_watch(Clock::duration limit) {
    watch.limit = limit;
    watch.thread = std::thread([this] {
      std::unique_lock lock(watch.mu);
      while (!watch.stop) {
        if (watch.queued == watch.opened) {
          watch.cv.wait(lock);
          continue;
        }
        const auto deadline = watch.since + watch.limit;
        if (Clock::now() < deadline) {
          watch.cv.wait_until(lock, deadline);
          continue;
        }
        give_up(watch.opened + 1);
      }
    });
  }

  // Called with watch.mu held: opens up to `ticket`, the data not a result.
  void give_up(std::uint64_t ticket) {
    std::atomic_ref<std::uint32_t>(timed_out[0]).store(1, std::memory_order_release);
    raise_counter(ticket);
    opened(ticket);
  }

  ~Shared() {
    if (watch.thread.joinable()) {
      {
        std::lock_guard lock(watch.mu);
        watch.stop = true;
        if (watch.queued > watch.opened) give_up(watch.queued);  // no stream may wait on freed memory
      }
      watch.cv.notify_one();
      watch.thread.join();
    }
    for (auto& r : retiring) {
      cudaEventSynchronize(r.done);
      cudaEventDestroy(r.done);
      for (auto& [bytes, block] : r.blocks) cudaFreeHost(block);
    }
    for (auto& [bytes, block] : free_blocks) cudaFreeHost(block);
    for (cudaEvent_t event : spare_events) cudaEventDestroy(event);
    if (gate) cudaFreeHost(const_cast<std::uint64_t*>(gate));
    if (timed_out) cudaFreeHost(timed_out);
  }

  // Called with mu held.
  void reclaim() {
    std::erase_if(retiring, [&](Retiring& r) {
      if (cudaEventQuery(r.done) != cudaSuccess) return false;
      spare_events.push_back(r.done);
      for (auto& [bytes, block] : r.blocks) free_blocks.emplace(bytes, block);
      return true;
    });
  }

  void* acquire(std::size_t bytes) {
    std::lock_guard lock(mu);
    reclaim();
    auto it = free_blocks.lower_bound(bytes);
    if (it != free_blocks.end() && it->first <= 2 * bytes) {
      void* block = it->second;
      free_blocks.erase(it);
      return block;
    }
    void* block = nullptr;
    check(cudaHostAlloc(&block, bytes, cudaHostAllocPortable),
          "cudaHostAlloc of " + std::to_string(bytes) + " bytes of pinned staging");
    return block;
  }

  cudaEvent_t take_event() {
    {
      std::lock_guard lock(mu);
      if (!spare_events.empty()) {
        cudaEvent_t event = spare_events.back();
        spare_events.pop_back();
        return event;
      }
    }
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    return event;
  }

  // Called with mu held. A pending record does not matter: the next
  // cudaEventRecord of the event replaces it.
  void give_back(cudaEvent_t event) {
    if (event) spare_events.push_back(event);
  }

  // `blocks` are free once `done` completes (the event is owned from here on).
  void retire(cudaEvent_t done, std::vector<std::pair<std::size_t, void*>> blocks) {
    std::lock_guard lock(mu);
    retiring.push_back({done, std::move(blocks)});
  }
};

// With lazy loading (CUDA 12.2 on), a kernel's first launch may synchronize
// the whole context (the CUDA Programming Guide's lazy-loading hazards). A
// stream held at a gate is a kernel that waits for the host, the host waits
// for the collective's kernels, and their first launch would then wait for
// the gate: a deadlock until the gate's timeout. Two ranks sharing an H200
// hung so in their first collective on device memory (issue 19; this is the
// likely cause, scripts/cuda_gate_probe.cu tells it from the others). So
// every kernel the collectives launch, and the gate itself, is loaded once
// per device before this process queues its first gate.
void preload_kernels(const Shared& shared) {
  static std::mutex mu;
  static std::set<int> loaded;
  std::lock_guard lock(mu);
  if (loaded.contains(shared.device)) return;
  struct OwnStream {
    cudaStream_t stream = nullptr;
    ~OwnStream() { if (stream) cudaStreamDestroy(stream); }
  } own;
  check(cudaStreamCreateWithFlags(&own.stream, cudaStreamNonBlocking), "cudaStreamCreate (preloading kernels)");
  try {
    kernels::cuda::preload(own.stream);
  } catch (const std::runtime_error& e) {  // the kernels' errors, as the device Reducer passes them on
    throw SystemError(e.what());
  }
  // Ticket 0 is open already: the gate kernel returns at once.
  check(launch_gate(own.stream, shared.gate_device, 0, 0, shared.timed_out_device), "preloading the stream gate");
  // Call 0 with no peers: the flag kernels return at once.
  const FlagBlocks none;
  check(launch_flag_begin(own.stream, none, 0, 0, shared.timed_out_device), "preloading the flag kernels");
  check(cudaStreamSynchronize(own.stream), "preloading the stream gate");
  loaded.insert(shared.device);
}

// Whether this process's contexts on `device` are MPS clients (false
// where the driver cannot say).
bool mps_enabled(int device) {
  int enabled = 0;
  if (cudaDeviceGetAttribute(&enabled, cudaDevAttrMpsEnabled, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return enabled != 0;
}

// device_loader.cc asks for eager loading; a process that set LAZY itself
// (PyTorch does, when it starts first) keeps it and is told what it risks.
void warn_if_lazy_loading() {
  static std::once_flag once;
  const char* mode = std::getenv("CUDA_MODULE_LOADING");
  if (mode == nullptr || std::string_view(mode) != "LAZY") return;
  std::call_once(once, [] {
    spdlog::warn("CUDA_MODULE_LOADING=LAZY: a kernel first launched while a collective on device memory is in "
                 "flight waits for that collective, which waits for it, until BRAID_TIMEOUT. Launch every kernel "
                 "once before the first collective, or set CUDA_MODULE_LOADING=EAGER");
  });
}

class CudaStagedOp final : public StagedOp {
 public:
  CudaStagedOp(std::shared_ptr<Shared> shared, std::shared_ptr<EventBook> events, std::uint64_t ticket)
      : shared_(std::move(shared)), events_(std::move(events)), ticket_(ticket) {}

  // Does not open the gate: opening out of issue order would release an
  // earlier call's stream before its result exists. The engine opens every
  // queued call's gate; a gate nobody opens gives up at its timeout.
  // The staging blocks go back to the pool once `finished` completes: it is
  // recorded after every copy that uses them. Without it (staging failed
  // before it was recorded) no queued copy reads them after `staged`.
  ~CudaStagedOp() override {
    if (finished_ && !blocks_.empty()) {
      shared_->retire(std::exchange(finished_, nullptr), std::move(blocks_));
      blocks_.clear();
    } else if (staged_ && !blocks_.empty()) {
      // Polled and bounded: this may run on the engine's thread, where a
      // blocking CUDA call can wait on a lock held by a caller's thread that
      // is itself blocked behind a gate (Shared::spare_events).
      try {
        wait_for_event(staged_, Clock::now() + std::chrono::seconds(10), "a failed call's copy to staging");
      } catch (const std::exception&) {
        blocks_.clear();   // a copy may still write them: they stay out of the pool
        staged_ = nullptr;  // and so does its event
      }
    }
    // Back to the pools: cudaFreeHost would wait for the whole device.
    // Every worker queued its wait for `ready` before this call ended.
    if (events_) events_->give_back(ready_);
    std::lock_guard lock(shared_->mu);
    for (auto& [bytes, block] : blocks_) shared_->free_blocks.emplace(bytes, block);
    shared_->give_back(finished_);
    shared_->give_back(staged_);
  }

  void wait_inputs(Clock::time_point deadline) override {
    if (!error_.empty()) throw SystemError(error_);
    if (ready_.event || flag_book_) return;  // gate `event`, `flag`: waited for on the device
    wait_inputs_on_host(deadline);
  }

  void wait_inputs_on_host(Clock::time_point deadline) override {
    staged_wake_.wait(staged_, deadline, "the work queued before this call on its CUDA stream did not finish");
  }

  // Ticket 0 (gate `host`): no gate was queued, the counter stays.
  void open_gate() override {
    if (ticket_ != 0) shared_->open(ticket_);
  }

  bool results_ready() override {
    if (std::atomic_ref<std::uint32_t>(shared_->timed_out[0]).load(std::memory_order_acquire) != 0)
      throw TimeoutError("a CUDA stream gave up waiting for a collective's result (BRAID_TIMEOUT plus a margin); "
                         "the data in its receive buffer is not the result");
    if (!finished_) return true;
    cudaError_t status = cudaEventQuery(finished_);
    if (status == cudaErrorNotReady) return false;
    check(status, "the copy of a collective's result back to device memory");
    return true;
  }

  void wait_results(Clock::time_point deadline) override {
    wait_for_event(finished_, deadline, "the copy of this call's result back to device memory did not finish");
    results_ready();
  }

  bool on_device() const override { return on_device_; }
  bool holds_caller() const override { return ticket_ == 0; }

  // Gate `flag`: the last flag kernel (or, where the call was not
  // flag-ordered, the host's waits) already holds the work after the call.
  void finish_on_caller() override {
    if (flag_book_) {
      DeviceScope scope(shared_->device);
      check(cudaEventRecord(finished_, stream_), "cudaEventRecord");
      return;
    }
    if (ready_.event) {
      DeviceScope scope(shared_->device);
      for (const DeviceEventRef& done : waits_)
        check(cudaStreamWaitEvent(stream_, events_->find(done), 0), "queueing the wait for a collective's kernels");
      check(cudaEventRecord(finished_, stream_), "cudaEventRecord");
      return;
    }
    if (!back_.bytes) return;
    DeviceScope scope(shared_->device);
    check(cudaMemcpyAsync(back_.to, back_.from, back_.bytes, cudaMemcpyHostToDevice, back_.stream),
          "queueing the result's copy back to device memory");
    check(cudaEventRecord(finished_, back_.stream), "cudaEventRecord");
  }

  DeviceEventRef ready_event() const override { return ready_.event ? ready_.ref : DeviceEventRef{}; }
  void wait_on_stream(std::vector<DeviceEventRef> events) override { waits_ = std::move(events); }
  DeviceFlagsRef flags(std::uint64_t call) const override {
    return flag_book_ ? flag_book_->ref(call) : DeviceFlagsRef{};
  }

  // Set by CudaStaging::stage.
  bool on_device_ = false;
  // Gate `event`: recorded on the caller's `stream_` after its input; the
  // events that stream waits for, from the engine.
  EventBook::Own ready_;
  cudaStream_t stream_ = nullptr;  // and gate `flag`'s
  std::vector<DeviceEventRef> waits_;
  // Gate `flag`: the book whose block orders the call (null: not flag-ordered).
  std::shared_ptr<FlagBook> flag_book_;
  // Gate `host`, a staged call: the result's copy, queued by finish_on_caller.
  struct {
    void* to = nullptr;
    const void* from = nullptr;
    std::size_t bytes = 0;
    cudaStream_t stream = nullptr;
  } back_;
  std::vector<std::pair<std::size_t, void*>> blocks_;
  cudaEvent_t staged_ = nullptr, finished_ = nullptr;
  StreamWake staged_wake_;  // gate `host`: queued right after `staged`
  std::string error_;  // a CUDA error met after the gate was queued

 private:
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<EventBook> events_;
  std::uint64_t ticket_;
};

class CudaStaging final : public DeviceStaging {
 public:
  CudaStaging(int device, std::chrono::milliseconds timeout, const std::string& gate_mode)
      : shared_(std::make_shared<Shared>()), timeout_(timeout) {
    if (gate_mode != "auto" && gate_mode != "kernel" && gate_mode != "wait" && gate_mode != "host" &&
        gate_mode != "event" && gate_mode != "flag")
      throw InvalidUsage("BRAID_CUDA_GATE=" + gate_mode + ": choose auto, kernel, wait, host, event or flag");
    event_gate_ = gate_mode == "event";
    flag_gate_ = gate_mode == "flag";
    host_gate_ = gate_mode == "host" || event_gate_ || flag_gate_;
    auto_gate_ = gate_mode == "auto";
    int count = 0;
    check(cudaGetDeviceCount(&count), "no usable CUDA device (cudaGetDeviceCount)");
    if (device < 0 || device >= count)
      throw InvalidUsage("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                         " visible)");
    shared_->device = device;
    DeviceScope scope(device);
    void* gate = nullptr;
    void* flag = nullptr;
    check(cudaHostAlloc(&gate, sizeof(std::uint64_t), cudaHostAllocMapped | cudaHostAllocPortable), "gate counter");
    shared_->gate = static_cast<volatile std::uint64_t*>(gate);
    *static_cast<std::uint64_t*>(gate) = 0;
    check(cudaHostAlloc(&flag, sizeof(std::uint32_t), cudaHostAllocMapped | cudaHostAllocPortable), "gate flag");
    shared_->timed_out = static_cast<std::uint32_t*>(flag);
    shared_->timed_out[0] = 0;
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&shared_->gate_device), gate, 0), "gate mapping");
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&shared_->timed_out_device), flag, 0), "flag mapping");
    preload_kernels(*shared_);
    warn_if_lazy_loading();
    events_ = EventBook::make(device);
    if (event_gate_ && !events_)
      throw SystemError("BRAID_CUDA_GATE=event: CUDA device " + std::to_string(device) +
                        " cannot share events between processes (cudaDevAttrIpcEventSupport)");
    mps_ = mps_enabled(device);
    if (flag_gate_ || (auto_gate_ && mps_)) flags_ = std::make_shared<FlagBook>(device);
    if (gate_mode == "wait") {
      shared_->wait_value = find_wait_value();
      shared_->start_watch(gate_limit());
    }
  }

  // Everything that may fail before the gate is queued throws here, and
  // the ticket is only taken once the gate is queued: no stream waits for
  // a call that never reached the engine.
  std::shared_ptr<StagedOp> stage(Op& op, int rank, int size, const CallShape& shape) override {
    if (op.memory.device != shared_->device)
      throw InvalidUsage("this communicator works on CUDA device " + std::to_string(shared_->device) +
                         " (its first call on device memory); this call's buffers are on device " +
                         std::to_string(op.memory.device));
    DeviceScope scope(shared_->device);
    auto staged = std::make_shared<CudaStagedOp>(shared_, events_, host_gate_ ? 0 : tickets_ + 1);
    if (!select_algorithm(shape).reason.staged) {
      const bool collective = op.kind != OpKind::send && op.kind != OpKind::recv;
      if (flag_gate_ && collective) stage_flagged(op, *staged);
      else if (event_gate_) stage_ordered(op, *staged);
      else stage_on_device(op, *staged);
      return staged;
    }
    stage_copies(op, rank, size, *staged);
    return staged;
  }

  // `auto`: the flag gate under MPS (every rank's work in one context),
  // else the host gate (where the contexts take the GPU in turns, a kernel
  // or a stream waiting for another process keeps its context busy).
  void note_gpu_shared() override {
    if (!auto_gate_ || host_gate_) return;
    host_gate_ = true;
    flag_gate_ = flags_ != nullptr;  // made under MPS
  }

  bool mps() const override { return mps_; }

  // Gate `host` wakes the engine from the Reducer's kernels by a host
  // function; `auto` polls as `kernel` does, whichever it becomes (on the
  // H200 a host function woke a thread 44 us later than polling did after
  // a 250 us kernel, the time a 256 MiB all_reduce takes).
  std::unique_ptr<Reducer> make_reducer() override {
    const auto timeout_ns =
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(gate_limit()).count());
    return make_device_reducer(shared_->device, host_gate_, events_,
                               {flags_, shared_->timed_out_device, timeout_ns});
  }

  std::array<std::uint8_t, 16> device_uuid() override {
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, shared_->device), "cudaGetDeviceProperties");
    std::array<std::uint8_t, 16> uuid{};
    static_assert(sizeof(properties.uuid.bytes) == uuid.size());
    std::memcpy(uuid.data(), properties.uuid.bytes, uuid.size());
    return uuid;
  }

  std::unique_ptr<Transport> connect_regions(std::shared_ptr<runtime::Store> store, const std::string& key_prefix,
                                             const cuda_ipc::CudaIpcOptions& options) override {
    return cuda_ipc::connect_cuda_ipc(std::move(store), key_prefix, options);
  }

 private:
  // The call runs on its device buffers (a direct collective): the stream
  // only waits at the gate, between `staged` and `finished` (with gate
  // `host`, recorded together: the caller's thread waits instead).
  void stage_on_device(const Op& op, CudaStagedOp& staged) {
    staged.on_device_ = true;
    auto stream = static_cast<cudaStream_t>(op.stream.cuda);
    create_events(staged);
    check(cudaEventRecord(staged.staged_, stream), "cudaEventRecord");
    if (host_gate_) staged.staged_wake_.queue(stream);
    else queue_gate(stream, tickets_ + 1);
    cudaError_t status = cudaEventRecord(staged.finished_, stream);
    if (status != cudaSuccess) staged.error_ = std::string("CUDA: cudaEventRecord: ") + cudaGetErrorString(status);
  }

  // Gate `event`, a direct collective: `ready` on the stream after its
  // input, and later (finish_on_caller) the waits for the workers' `done`
  // and `finished`. Nothing here waits on the host.
  void stage_ordered(const Op& op, CudaStagedOp& staged) {
    staged.on_device_ = true;
    staged.stream_ = static_cast<cudaStream_t>(op.stream.cuda);
    staged.ready_ = events_->take();
    staged.finished_ = shared_->take_event();
    check(cudaEventRecord(staged.ready_.event, staged.stream_), "cudaEventRecord");
  }

  // Gate `flag`, a direct collective: `staged` on the stream for a host
  // wait should the peers' calls not be flag-ordered.
  // The flag kernels and the steps are queued once the ranks have swapped
  // (comm/algorithms/direct.cc), `finished` after them (finish_on_caller).
  void stage_flagged(const Op& op, CudaStagedOp& staged) {
    staged.on_device_ = true;
    staged.stream_ = static_cast<cudaStream_t>(op.stream.cuda);
    create_events(staged);
    check(cudaEventRecord(staged.staged_, staged.stream_), "cudaEventRecord");
    staged.flag_book_ = flags_;
  }

  // The call runs on pinned host staging: the send buffer is copied out
  // before the gate, the result back after it, and op points at the staging.
  // With gate `host` the result's copy waits for finish_on_caller, and
  // `finished` is first recorded after the copy out, so that the blocks
  // wait for it even where the call fails.
  void stage_copies(Op& op, int rank, int size, CudaStagedOp& staged) {
    const std::size_t es = dtype_bytes(op.dtype);
    const std::size_t send_bytes = send_elements(op, rank, size) * es, recv_bytes = recv_elements(op, rank, size) * es;
    auto* send = static_cast<const std::byte*>(op.send);
    auto* recv = static_cast<std::byte*>(op.recv);
    std::byte* host_send = nullptr;
    std::byte* host_recv = nullptr;
    const bool overlap = send_bytes && recv_bytes && send < recv + recv_bytes && recv < send + send_bytes;
    if (overlap) {  // in place: one block keeps the buffers' relative position
      const std::byte* lo = std::min<const std::byte*>(send, recv);
      const std::byte* hi = std::max<const std::byte*>(send + send_bytes, recv + recv_bytes);
      std::byte* block = take_block(staged, static_cast<std::size_t>(hi - lo));
      host_send = block + (send - lo);
      host_recv = block + (recv - lo);
    } else {
      if (send_bytes) host_send = take_block(staged, send_bytes);
      if (recv_bytes) host_recv = take_block(staged, recv_bytes);
    }
    create_events(staged);
    auto stream = static_cast<cudaStream_t>(op.stream.cuda);
    if (send_bytes)
      check(cudaMemcpyAsync(host_send, send, send_bytes, cudaMemcpyDeviceToHost, stream), "staging the send buffer");
    check(cudaEventRecord(staged.staged_, stream), "cudaEventRecord");
    if (host_gate_) staged.staged_wake_.queue(stream);
    op.send = host_send;
    op.recv = host_recv;
    if (host_gate_) {
      check(cudaEventRecord(staged.finished_, stream), "cudaEventRecord");
      staged.back_ = {recv, host_recv, recv_bytes, stream};
      return;
    }
    queue_gate(stream, tickets_ + 1);
    // From here on the ticket must open in order: errors are kept for the engine.
    cudaError_t status = cudaSuccess;
    if (recv_bytes) status = cudaMemcpyAsync(recv, host_recv, recv_bytes, cudaMemcpyHostToDevice, stream);
    if (status == cudaSuccess) status = cudaEventRecord(staged.finished_, stream);
    if (status != cudaSuccess)
      staged.error_ = std::string("CUDA: queueing the result's copy: ") + cudaGetErrorString(status);
  }

  std::byte* take_block(CudaStagedOp& staged, std::size_t bytes) {
    auto* block = static_cast<std::byte*>(shared_->acquire(bytes));
    staged.blocks_.emplace_back(bytes, block);
    return block;
  }

  void create_events(CudaStagedOp& staged) {
    staged.staged_ = shared_->take_event();
    staged.finished_ = shared_->take_event();
  }

  // How long a gate waits before it gives up: BRAID_TIMEOUT plus a margin,
  // so that the engine, which waits at most BRAID_TIMEOUT, reports first.
  Clock::duration gate_limit() const { return timeout_ + std::chrono::seconds(10); }

  static WaitValue64 find_wait_value() {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check(cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &fn, 12000, cudaEnableDefault, &found),
          "looking up cuStreamWaitValue64 (BRAID_CUDA_GATE=wait)");
    if (found != cudaDriverEntryPointSuccess || fn == nullptr)
      throw SystemError("BRAID_CUDA_GATE=wait: this CUDA driver has no cuStreamWaitValue64");
    return reinterpret_cast<WaitValue64>(fn);
  }

  // Queues the gate for `ticket` and takes the ticket.
  void queue_gate(cudaStream_t stream, std::uint64_t ticket) {
    if (shared_->wait_value) {
      const CUresult status = shared_->wait_value(static_cast<CUstream>(stream),
                                                  reinterpret_cast<CUdeviceptr>(shared_->gate_device), ticket,
                                                  CU_STREAM_WAIT_VALUE_GEQ);
      if (status != CUDA_SUCCESS)
        throw SystemError("CUDA: cuStreamWaitValue64 (the stream gate) failed: error " +
                          std::to_string(static_cast<int>(status)));
      shared_->queued(ticket);
    } else {
      const auto timeout_ns = static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(gate_limit()).count());
      check(launch_gate(stream, shared_->gate_device, ticket, timeout_ns, shared_->timed_out_device),
            "launching the stream gate");
    }
    tickets_ = ticket;
  }

  std::shared_ptr<Shared> shared_;
  std::chrono::milliseconds timeout_;
  bool host_gate_ = false;  // BRAID_CUDA_GATE=host, event or flag, or auto on a shared GPU: the caller waits
  bool event_gate_ = false;  // BRAID_CUDA_GATE=event
  bool flag_gate_ = false;  // BRAID_CUDA_GATE=flag, or auto on a GPU shared under MPS
  std::shared_ptr<FlagBook> flags_;  // gate `flag`, or `auto` under MPS
  std::shared_ptr<EventBook> events_;  // null where the device has no IPC events
  bool mps_ = false;  // this process's context on the device is an MPS client's
  bool auto_gate_ = false;  // BRAID_CUDA_GATE=auto: kernel until note_gpu_shared, then host
  std::uint64_t tickets_ = 0;
};

}  // namespace

std::unique_ptr<DeviceStaging> make_device_staging(int device, std::chrono::milliseconds timeout,
                                                   const std::string& gate) {
  return std::make_unique<CudaStaging>(device, timeout, gate);
}

}  // namespace braid::comm
