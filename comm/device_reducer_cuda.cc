// The device Reducer (DeviceStaging::make_reducer, CUDA builds): the direct
// collectives' steps as kernels::cuda::reduce_multi on a non-blocking
// stream of the communicator's device. The stream waits for nothing on the
// caller's stream: the engine has already waited (on the host) for the
// call's `staged` event, and the caller's stream waits at the gate until
// the collective is over, so the kernels run between the two. finish()
// records an event after the kernels and waits for it, bounded, before the
// collective's closing barrier tells the peers this rank's share is written.
//
// That wait is on every direct collective's path, so it polls finely
// (wait_for_event: sleeps of an eighth of the time waited, at a timer slack
// of 1 us). Under gate `host` a host function queued after the event wakes
// the waiting thread besides (StreamWake, comm/device_cuda.h, which says
// why only there).
//
// Under gate `flag` a call's steps run on the caller's stream instead,
// between the flag kernels (Reducer::order_by_flags): nothing waits on the
// host, and no event passes between the two streams. A call on another
// stream than the one before waits on the device for that one's end (the
// `chain_` event): the flags say only "this rank's stream has reached call
// N or later", so a later call that ran ahead on a stream of its own would
// tell the peers this rank's input for N was written while N still waited
// on its stream. So each rank's flag-ordered calls run one after another
// on the GPU, in issue order, whatever streams they come on (as a NCCL
// communicator's kernels do), and the work that uses a peer's mapping is
// done once the last call's is (cuda_ipc's PeerRegions relies on it).
#include <cuda_runtime.h>

#include <stdexcept>
#include <utility>

#include "comm/device.h"
#include "comm/device_cuda.h"
#include "kernels/cuda/reduce.h"
#include "runtime/errors.h"

namespace braid::comm {
namespace {

static_assert(kMaxDirectRanks == kernels::cuda::kMaxMulti, "a direct step on a device is one reduce_multi");
static_assert(kMaxDirectRanks == kMaxFlagRanks, "gate flag orders every direct collective on a device");

class CudaReducer final : public Reducer {
 public:
  // The stream and the event are made here, on the thread of the first call
  // on device memory: on the engine's thread cudaStreamCreate waited on a
  // lock held by the caller's thread, blocked in a copy to pageable memory
  // behind the gate the engine was to open (issue 19, test_comm_device's
  // stream-order case). For the same reason the process's first host
  // function runs here, before any collective (the driver may start its
  // callback thread for it).
  CudaReducer(int device, bool wake, std::shared_ptr<EventBook> events, FlagWaits flags)
      : device_(device), wake_(wake), events_(std::move(events)), flags_(std::move(flags)) {
    DeviceScope scope(device_);
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    if (events_) {  // the book owns it
      done_own_ = events_->take();
      done_ = done_own_.event;
    } else {
      check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    }
    if (flags_.book) check_cuda(cudaEventCreateWithFlags(&chain_, cudaEventDisableTiming), "cudaEventCreate");
    if (!wake_) return;
    StreamWake first;
    first.queue(stream_);
    check_cuda(cudaStreamSynchronize(stream_), "the device Reducer's first host function");
  }

  ~CudaReducer() override {
    if (done_ && !events_) cudaEventDestroy(done_);
    if (chain_) cudaEventDestroy(chain_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  void reduce_multi(std::span<void* const> dsts, std::span<const void* const> srcs, std::size_t count,
                    DataType dtype, ReduceOp op, Averaging avg) override {
    if (avg.scale_up != 0 || avg.source_shift != 0)
      throw InvalidUsage("reduce_multi on a device: an avg's scaling is for host memory only");
    if (count == 0) return;
    DeviceScope scope(device_);
    try {
      kernels::cuda::reduce_multi(dsts.data(), static_cast<int>(dsts.size()), srcs.data(),
                                  static_cast<int>(srcs.size()), count, dtype, op, avg.divisor,
                                  flagged_ ? call_stream_ : stream_);
    } catch (const std::runtime_error& e) {
      throw SystemError(e.what());
    }
    pending_ = true;
  }

  void finish(Clock::time_point deadline) override {
    flagged_ = false;  // only after a flag-ordered call that failed midway
    queued_ = false;
    if (!pending_) return;
    DeviceScope scope(device_);
    check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
    StreamWake wake;
    if (wake_) wake.queue(stream_);  // else wait() polls as wait_for_event
    wake.wait(done_, deadline, "this rank's kernels of a collective on device memory did not finish");
    pending_ = false;
  }

  void wait_for(std::span<const DeviceEventRef> events) override {
    if (!events_) throw SystemError("a peer's stream is ordered by a CUDA IPC event, which this device cannot open");
    DeviceScope scope(device_);
    for (const DeviceEventRef& event : events)
      if (event.set())
        check_cuda(cudaStreamWaitEvent(stream_, events_->find(event), 0), "queueing the wait for a rank's input");
  }

  void order_by_flags(std::span<const DeviceFlagsRef> flags, int me, Stream stream) override {
    if (!flags_.book)
      throw SystemError("every rank's call is ordered by flags (BRAID_CUDA_GATE=flag), but this device path has no "
                        "block of flags");
    DeviceScope scope(device_);
    blocks_ = flags_.book->blocks(flags, me);
    call_ = flags[static_cast<std::size_t>(me)].call;
    call_stream_ = static_cast<cudaStream_t>(stream.cuda);
    if (chained_ && chain_stream_ != call_stream_)
      check_cuda(cudaStreamWaitEvent(call_stream_, chain_, 0), "queueing the wait for this rank's previous call");
    flagged_ = true;
    check_cuda(launch_flag_begin(call_stream_, blocks_, call_, flags_.timeout_ns, flags_.timed_out),
               "launching the flag wait before a collective's kernels");
  }

  void finish_flagged() override {
    if (!std::exchange(flagged_, false)) return;
    DeviceScope scope(device_);
    queued_ = std::exchange(pending_, false);
    queued_on_ = call_stream_;
    check_cuda(launch_flag_end(call_stream_, blocks_, call_, flags_.timeout_ns, flags_.timed_out),
               "launching the flag wait after a collective's kernels");
    check_cuda(cudaEventRecord(chain_, call_stream_), "cudaEventRecord (the end of a flag-ordered call)");
    chained_ = true;
    chain_stream_ = call_stream_;
  }

  DeviceEventRef done_event() override { return events_ ? done_own_.ref : DeviceEventRef{}; }

  // No StreamWake here: nothing waits on the host.
  bool finish_queued(Clock::time_point deadline) override {
    if (!events_) {
      finish(deadline);
      return false;
    }
    DeviceScope scope(device_);
    check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
    queued_ = std::exchange(pending_, false);
    queued_on_ = stream_;
    return true;
  }

  bool take_queued(Stream& stream) override {
    if (!std::exchange(queued_, false)) return false;
    stream.cuda = queued_on_;
    return true;
  }

 private:
  int device_;
  bool wake_;
  std::shared_ptr<EventBook> events_;  // null: the device has no IPC events
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;  // with events_, done_own_'s: peers may wait for it
  EventBook::Own done_own_;
  bool pending_ = false;  // kernels issued since the last finish()
  // Kernels the last call left queued (finish_queued, finish_flagged), on
  // queued_on_, until take_queued.
  bool queued_ = false;
  cudaStream_t queued_on_ = nullptr;
  // Gate `flag`: whether a flag-ordered call is running (its steps go on
  // its caller's stream, which may be the legacy default stream, null),
  // its stream, its number and every rank's block.
  FlagWaits flags_;
  bool flagged_ = false;
  cudaStream_t call_stream_ = nullptr;
  std::uint64_t call_ = 0;
  FlagBlocks blocks_;
  // After the last flag-ordered call's end kernel, on its stream: the next
  // call on another stream waits for it (the header comment).
  cudaEvent_t chain_ = nullptr;
  bool chained_ = false;
  cudaStream_t chain_stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Reducer> make_device_reducer(int device, bool wake, std::shared_ptr<EventBook> events,
                                             FlagWaits flags) {
  return std::make_unique<CudaReducer>(device, wake, std::move(events), std::move(flags));
}

}  // namespace braid::comm
