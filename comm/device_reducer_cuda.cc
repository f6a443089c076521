// The device Reducer (DeviceStaging::make_reducer, CUDA builds): the direct
// collectives' steps as kernels::cuda::reduce_multi on a non-blocking
// stream of the communicator's device. The stream waits for nothing on the
// caller's stream: the engine has already waited (on the host) for the
// call's `staged` event, and the caller's stream waits at the gate until
// the collective is over, so the kernels run between the two. finish()
// records an event after the kernels and waits for it, bounded, before the
// collective's closing barrier tells the peers this rank's share is written.
//
// That wait is on every direct collective's path, so it does not sleep-poll
// alone (a sleep lasts at least the timer slack, about 50 us on Linux, and
// a kernel of 256 MiB takes about 250 us): a host function queued after the
// event (cudaLaunchHostFunc) wakes the engine's thread once the stream gets
// there. The wait still ends on cudaEventQuery alone, and polls every 100
// us meanwhile, so a host function late or lost costs only the old
// latency, never a result.
#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <stdexcept>

#include "comm/device.h"
#include "comm/device_cuda.h"
#include "kernels/cuda/reduce.h"
#include "runtime/errors.h"

namespace braid::comm {
namespace {

static_assert(kMaxDirectRanks == kernels::cuda::kMaxMulti, "a direct step on a device is one reduce_multi");

// What a host function tells finish(): how many have run. Each pending one
// holds a reference, so the waker outlives a reducer destroyed before its
// stream got there (a finish() that timed out).
struct Waker {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t fired = 0;

  // On CUDA's callback thread: no CUDA calls here.
  static void CUDART_CB fire(void* data) {
    std::unique_ptr<std::shared_ptr<Waker>> self(static_cast<std::shared_ptr<Waker>*>(data));
    Waker& waker = **self;
    {
      std::lock_guard lock(waker.mu);
      ++waker.fired;
    }
    waker.cv.notify_all();
  }
};

class CudaReducer final : public Reducer {
 public:
  // The stream and the event are made here, on the thread of the first call
  // on device memory: on the engine's thread cudaStreamCreate waited on a
  // lock held by the caller's thread, blocked in a copy to pageable memory
  // behind the gate the engine was to open (issue 19, test_comm_device's
  // stream-order case).
  // For the same reason the first host function runs here (the driver
  // may start its callback thread for it).
  explicit CudaReducer(int device) : device_(device) {
    DeviceScope scope(device_);
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaLaunchHostFunc(stream_, &Waker::fire, new std::shared_ptr<Waker>(waker_)),
               "cudaLaunchHostFunc (the device Reducer's wake-up)");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    queued_ = 1;
  }

  ~CudaReducer() override {
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  void reduce_multi(std::span<void* const> dsts, std::span<const void* const> srcs, std::size_t count,
                    DataType dtype, ReduceOp op, int divisor) override {
    if (count == 0) return;
    DeviceScope scope(device_);
    try {
      kernels::cuda::reduce_multi(dsts.data(), static_cast<int>(dsts.size()), srcs.data(),
                                  static_cast<int>(srcs.size()), count, dtype, op, divisor, stream_);
    } catch (const std::runtime_error& e) {
      throw SystemError(e.what());
    }
    pending_ = true;
  }

  void finish(Clock::time_point deadline) override {
    if (!pending_) return;
    DeviceScope scope(device_);
    check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
    const char* what = "this rank's kernels of a collective on device memory did not finish";
    auto* reference = new std::shared_ptr<Waker>(waker_);
    if (cudaLaunchHostFunc(stream_, &Waker::fire, reference) != cudaSuccess) {
      delete reference;
      (void)cudaGetLastError();  // not sticky: the event's query reports what matters
      wait_for_event(done_, deadline, what);
    } else {
      wait_woken(++queued_, deadline, what);
    }
    pending_ = false;
  }

 private:
  // Until `done_` completes: woken by host function `ticket`, or polled.
  void wait_woken(std::uint64_t ticket, Clock::time_point deadline, const char* what) {
    for (;;) {
      const cudaError_t status = cudaEventQuery(done_);
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) check_cuda(status, what);
      if (Clock::now() >= deadline) throw TimeoutError(std::string(what) + " within BRAID_TIMEOUT");
      std::unique_lock lock(waker_->mu);
      waker_->cv.wait_for(lock, std::chrono::microseconds(100), [&] { return waker_->fired >= ticket; });
    }
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  bool pending_ = false;  // kernels issued since the last finish()
  std::shared_ptr<Waker> waker_ = std::make_shared<Waker>();
  std::uint64_t queued_ = 0;  // host functions queued on stream_
};

}  // namespace

std::unique_ptr<Reducer> make_device_reducer(int device) { return std::make_unique<CudaReducer>(device); }

}  // namespace braid::comm
