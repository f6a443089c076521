// comm/device.h on the CUDA runtime (CUDA builds only).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <array>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/device.h"
#include "comm/device_gate.h"
#include "kernels/cuda/reduce.h"
#include "runtime/device.h"
#include "runtime/errors.h"

namespace braid::comm {
namespace {

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw SystemError("CUDA: " + what + ": " + cudaGetErrorString(status));
}

// Makes `device` current for a scope and restores the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  }
  ~DeviceScope() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

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
  volatile std::uint64_t* gate = nullptr;  // host view
  std::uint64_t* gate_device = nullptr;
  std::uint32_t* timed_out = nullptr;  // host view; [0] set by a gate that gave up
  std::uint32_t* timed_out_device = nullptr;
  // The CUDA IPC path: its stream, and the peers' allocations mapped so far
  // (by handle, oldest first; a handle names one allocation for its life).
  cudaStream_t ipc_stream = nullptr;
  std::map<std::array<char, CUDA_IPC_HANDLE_SIZE>, void*> mapped;
  std::deque<std::array<char, CUDA_IPC_HANDLE_SIZE>> mapped_order;
  static constexpr std::size_t kMaxMapped = 64;

  ~Shared() {
    for (auto& r : retiring) {
      cudaEventSynchronize(r.done);
      cudaEventDestroy(r.done);
      for (auto& [bytes, block] : r.blocks) cudaFreeHost(block);
    }
    for (auto& [bytes, block] : free_blocks) cudaFreeHost(block);
    if (gate) cudaFreeHost(const_cast<std::uint64_t*>(gate));
    if (timed_out) cudaFreeHost(timed_out);
    for (auto& [handle, base] : mapped) cudaIpcCloseMemHandle(base);
    if (ipc_stream) cudaStreamDestroy(ipc_stream);
  }

  // A peer's allocation in this process (the engine's thread only). Keeps
  // the last kMaxMapped: a training loop's buffers come back every step.
  void* map(const cudaIpcMemHandle_t& handle) {
    std::array<char, CUDA_IPC_HANDLE_SIZE> key;
    std::memcpy(key.data(), handle.reserved, key.size());
    if (auto it = mapped.find(key); it != mapped.end()) return it->second;
    if (mapped.size() >= kMaxMapped) {
      cudaIpcCloseMemHandle(mapped[mapped_order.front()]);
      mapped.erase(mapped_order.front());
      mapped_order.pop_front();
    }
    void* base = nullptr;
    check(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess),
          "cudaIpcOpenMemHandle of a peer's buffer (can this GPU reach the peer's?)");
    mapped.emplace(key, base);
    mapped_order.push_back(key);
    return base;
  }

  // Called with mu held.
  void reclaim() {
    std::erase_if(retiring, [&](Retiring& r) {
      if (cudaEventQuery(r.done) != cudaSuccess) return false;
      cudaEventDestroy(r.done);
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

  // `blocks` are free once `done` completes (the event is owned from here on).
  void retire(cudaEvent_t done, std::vector<std::pair<std::size_t, void*>> blocks) {
    std::lock_guard lock(mu);
    retiring.push_back({done, std::move(blocks)});
  }
};

class CudaStagedOp final : public StagedOp {
 public:
  CudaStagedOp(std::shared_ptr<Shared> shared, std::uint64_t ticket)
      : shared_(std::move(shared)), ticket_(ticket) {}

  // Does not open the gate: opening out of issue order would release an
  // earlier call's stream before its result exists. The engine opens every
  // queued call's gate; a gate nobody opens gives up at its timeout.
  // The staging blocks go back to the pool once `finished` completes: it is
  // recorded after every copy that uses them. Without it (staging failed
  // before it was recorded) no queued copy reads them after `staged`.
  ~CudaStagedOp() override {
    if (finished_ && !blocks_.empty()) {
      shared_->retire(finished_, std::move(blocks_));
    } else {  // back to the pool: cudaFreeHost would wait for the whole device
      if (staged_) cudaEventSynchronize(staged_);
      std::lock_guard lock(shared_->mu);
      for (auto& [bytes, block] : blocks_) shared_->free_blocks.emplace(bytes, block);
      if (finished_) cudaEventDestroy(finished_);
    }
    if (staged_) cudaEventDestroy(staged_);
    if (kernel_done_) cudaEventDestroy(kernel_done_);
  }

  void wait_inputs(Clock::time_point deadline) override {
    if (!error_.empty()) throw SystemError(error_);
    poll(staged_, deadline, "the work queued before this call on its CUDA stream did not finish");
  }

  void open_gate() override {
    // Tickets open in issue order, so the counter only grows.
    std::atomic_ref<std::uint64_t> gate(*const_cast<std::uint64_t*>(shared_->gate));
    gate.store(ticket_, std::memory_order_release);
  }

  bool results_ready() override {
    if (shared_->timed_out[0] != 0)
      throw TimeoutError("a CUDA stream gave up waiting for a collective's result (BRAID_TIMEOUT plus a margin); "
                         "the data in its receive buffer is not the result");
    if (!finished_) return true;
    cudaError_t status = cudaEventQuery(finished_);
    if (status == cudaErrorNotReady) return false;
    check(status, "the copy of a collective's result back to device memory");
    return true;
  }

  void wait_results(Clock::time_point deadline) override {
    poll(finished_, deadline, "the copy of this call's result back to device memory did not finish");
    results_ready();
  }

  bool on_device() const override { return ipc_; }

  // The device path (comm/device.h): swap handles, map the peers' buffers,
  // launch this rank's share of the collective (kernels reading and writing
  // peers' memory directly), a barrier.
  void run_on_device(Exchange& x) override {
    const Op& op = x.op();
    const int n = x.size(), me = x.rank();
    std::vector<IpcBuffers> theirs(static_cast<std::size_t>(n));
    x.swap_with_all(0, &mine_, theirs.data(), sizeof(IpcBuffers));
    DeviceScope scope(shared_->device);
    // Every rank's send and receive buffers as this process sees them (null
    // where that rank's call does not use one).
    std::vector<const std::byte*> send(static_cast<std::size_t>(n));
    std::vector<std::byte*> recv(static_cast<std::size_t>(n));
    for (int p = 0; p < n; ++p) {
      if (p == me) {
        send[p] = static_cast<const std::byte*>(op.send);
        recv[p] = static_cast<std::byte*>(op.recv);
        continue;
      }
      const IpcBuffers& b = theirs[p];
      std::byte* send_base = b.has_send ? static_cast<std::byte*>(shared_->map(b.send)) : nullptr;
      std::byte* recv_base =
          !b.has_recv ? nullptr : b.same ? send_base : static_cast<std::byte*>(shared_->map(b.recv));
      send[p] = send_base ? send_base + b.send_offset : nullptr;
      recv[p] = recv_base ? recv_base + b.recv_offset : nullptr;
    }
    launch_share(op, n, me, send, recv);
    check(cudaEventRecord(kernel_done_, shared_->ipc_stream), "cudaEventRecord");
    poll(kernel_done_, Clock::now() + timeout_, "this rank's kernels of a collective on device memory did not finish");
    // Every rank's output is complete once every rank's kernels are.
    std::uint8_t token = 1;
    std::vector<std::uint8_t> tokens(static_cast<std::size_t>(n));
    x.swap_with_all(1, &token, tokens.data(), 1);
  }

  // This rank's share, every byte read once and written once:
  //   all_reduce      chunk `me` of every input, reduced, into chunk `me` of every output;
  //   reduce          chunk `me` of every input, reduced, into chunk `me` of the root's output;
  //   reduce_scatter  block `me` of every input, reduced, into this rank's output;
  //   all_gather      this rank's input into block `me` of every output;
  //   broadcast       the root's input into this rank's output;
  //   all_to_all      block p of this rank's input into block `me` of rank p's output.
  void launch_share(const Op& op, int n, int me, const std::vector<const std::byte*>& send,
                    const std::vector<std::byte*>& recv) {
    const std::size_t es = dtype_bytes(op.dtype), c = op.count;
    const int divisor = op.reduce_op == ReduceOp::avg ? n : 0;
    auto run = [&](std::vector<void*> dsts, std::vector<const void*> srcs, std::size_t count, bool reduces) {
      if (count == 0) return;
      try {
        kernels::cuda::reduce_multi(dsts.data(), static_cast<int>(dsts.size()), srcs.data(),
                                    static_cast<int>(srcs.size()), count, op.dtype,
                                    reduces ? op.reduce_op : ReduceOp::sum, reduces ? divisor : 0,
                                    shared_->ipc_stream);
      } catch (const std::runtime_error& e) {
        throw SystemError(e.what());
      }
    };
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    switch (op.kind) {
      case OpKind::all_reduce:
      case OpKind::reduce: {
        const ChunkLayout layout{c, n};
        const std::size_t at = layout.offset(me) * es;
        for (int p = 0; p < n; ++p) srcs.push_back(send[p] + at);
        if (op.kind == OpKind::all_reduce)
          for (int p = 0; p < n; ++p) dsts.push_back(recv[p] + at);
        else
          dsts.push_back(recv[op.root] + at);
        return run(dsts, srcs, layout.count_of(me), true);
      }
      case OpKind::reduce_scatter:
        for (int p = 0; p < n; ++p) srcs.push_back(send[p] + me * c * es);
        return run({recv[me]}, srcs, c, true);
      case OpKind::all_gather:
        for (int p = 0; p < n; ++p) dsts.push_back(recv[p] + me * c * es);
        return run(dsts, {send[me]}, c, false);
      case OpKind::broadcast:
        return run({recv[me]}, {send[op.root]}, c, false);
      case OpKind::all_to_all:
        for (int p = 0; p < n; ++p) run({recv[p] + me * c * es}, {send[me] + p * c * es}, c, false);
        return;
      default:
        throw InvalidUsage(std::string(name(op.kind)) + " has no device path");
    }
  }

  // What a rank tells its peers about its buffers.
  struct IpcBuffers {
    cudaIpcMemHandle_t send, recv;
    std::uint64_t send_offset = 0, recv_offset = 0;
    std::uint8_t has_send = 0, has_recv = 0;  // the call uses the buffer on that rank
    std::uint8_t same = 0;                    // one allocation holds both
  };

  // Set by CudaStaging::stage.
  bool ipc_ = false;
  IpcBuffers mine_{};
  cudaEvent_t kernel_done_ = nullptr;
  std::chrono::milliseconds timeout_{0};
  std::vector<std::pair<std::size_t, void*>> blocks_;
  cudaEvent_t staged_ = nullptr, finished_ = nullptr;
  std::string error_;  // a CUDA error met after the gate was queued

 private:
  // Bounded polling with a growing sleep: an event on a busy stream may take
  // long, and a worker thread must not spin on a shared core.
  static void poll(cudaEvent_t event, Clock::time_point deadline, const char* what) {
    if (!event) return;
    auto pause = std::chrono::microseconds(5);
    for (;;) {
      cudaError_t status = cudaEventQuery(event);
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) check(status, what);
      if (Clock::now() >= deadline) throw TimeoutError(std::string(what) + " within BRAID_TIMEOUT");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  std::shared_ptr<Shared> shared_;
  std::uint64_t ticket_;
};

class CudaStaging final : public DeviceStaging {
 public:
  CudaStaging(int device, std::chrono::milliseconds timeout)
      : shared_(std::make_shared<Shared>()), timeout_(timeout) {
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
  }

  std::shared_ptr<StagedOp> stage(Op& op, int rank, int size, CallShape shape) override {
    if (op.memory.device != shared_->device)
      throw InvalidUsage("this communicator works on CUDA device " + std::to_string(shared_->device) +
                         " (its first call on device memory); this call's buffers are on device " +
                         std::to_string(op.memory.device));
    DeviceScope scope(shared_->device);
    const std::size_t es = dtype_bytes(op.dtype);
    const std::size_t send_bytes = send_elements(op, rank, size) * es, recv_bytes = recv_elements(op, rank, size) * es;
    // Everything that may fail before the gate is queued throws here, and
    // the ticket is only taken once the gate is queued: no stream waits for
    // a call that never reached the engine.
    const std::uint64_t ticket = tickets_ + 1;
    auto staged = std::make_shared<CudaStagedOp>(shared_, ticket);
    staged->timeout_ = timeout_;
    // What the device path can do for this call; select.cc decides.
    shape.device_peers_mappable =
        has_device_path(op.kind) && size <= kernels::cuda::kMaxMulti && shareable(op, rank, size, staged->mine_);
    if (select_algorithm(shape).name == "cuda_ipc") {
      staged->ipc_ = true;
      if (!shared_->ipc_stream)
        check(cudaStreamCreateWithFlags(&shared_->ipc_stream, cudaStreamNonBlocking), "cudaStreamCreate");
      auto stream = static_cast<cudaStream_t>(op.stream.cuda);
      check(cudaEventCreateWithFlags(&staged->staged_, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaEventCreateWithFlags(&staged->finished_, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaEventCreateWithFlags(&staged->kernel_done_, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaEventRecord(staged->staged_, stream), "cudaEventRecord");
      queue_gate(stream, ticket);
      cudaError_t status = cudaEventRecord(staged->finished_, stream);
      if (status != cudaSuccess) staged->error_ = std::string("CUDA: cudaEventRecord: ") + cudaGetErrorString(status);
      return staged;
    }
    std::byte* host_send = nullptr;
    std::byte* host_recv = nullptr;
    auto* send = static_cast<const std::byte*>(op.send);
    auto* recv = static_cast<std::byte*>(op.recv);
    const bool overlap = send_bytes && recv_bytes && send < recv + recv_bytes && recv < send + send_bytes;
    if (overlap) {  // in place: one block keeps the buffers' relative position
      const std::byte* lo = std::min<const std::byte*>(send, recv);
      const std::byte* hi = std::max<const std::byte*>(send + send_bytes, recv + recv_bytes);
      auto* block = static_cast<std::byte*>(shared_->acquire(static_cast<std::size_t>(hi - lo)));
      staged->blocks_.emplace_back(static_cast<std::size_t>(hi - lo), block);
      host_send = block + (send - lo);
      host_recv = block + (recv - lo);
    } else {
      if (send_bytes) {
        host_send = static_cast<std::byte*>(shared_->acquire(send_bytes));
        staged->blocks_.emplace_back(send_bytes, host_send);
      }
      if (recv_bytes) {
        host_recv = static_cast<std::byte*>(shared_->acquire(recv_bytes));
        staged->blocks_.emplace_back(recv_bytes, host_recv);
      }
    }
    check(cudaEventCreateWithFlags(&staged->staged_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&staged->finished_, cudaEventDisableTiming), "cudaEventCreate");
    auto stream = static_cast<cudaStream_t>(op.stream.cuda);
    if (send_bytes)
      check(cudaMemcpyAsync(host_send, send, send_bytes, cudaMemcpyDeviceToHost, stream), "staging the send buffer");
    check(cudaEventRecord(staged->staged_, stream), "cudaEventRecord");
    queue_gate(stream, ticket);
    // From here on the ticket must open in order: errors are kept for the engine.
    cudaError_t status = cudaSuccess;
    if (recv_bytes) status = cudaMemcpyAsync(recv, host_recv, recv_bytes, cudaMemcpyHostToDevice, stream);
    if (status == cudaSuccess) status = cudaEventRecord(staged->finished_, stream);
    if (status != cudaSuccess)
      staged->error_ = std::string("CUDA: queueing the result's copy: ") + cudaGetErrorString(status);
    op.send = host_send;
    op.recv = host_recv;
    return staged;
  }

 private:
  // Queues the gate for `ticket` and takes the ticket.
  void queue_gate(cudaStream_t stream, std::uint64_t ticket) {
    const auto timeout_ns =
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_).count()) +
        10'000'000'000ull;
    check(launch_gate(stream, shared_->gate_device, ticket, timeout_ns, shared_->timed_out_device),
          "launching the stream gate");
    tickets_ = ticket;
  }

  static bool has_device_path(OpKind kind) {
    return kind == OpKind::all_reduce || kind == OpKind::reduce || kind == OpKind::reduce_scatter ||
           kind == OpKind::all_gather || kind == OpKind::broadcast || kind == OpKind::all_to_all;
  }

  // Whether CUDA IPC can share the buffers `op` uses on `rank`; fills `out` if so.
  static bool shareable(const Op& op, int rank, int size, CudaStagedOp::IpcBuffers& out) {
    auto share = [](const void* p, cudaIpcMemHandle_t& handle, std::uint64_t& offset, const void*& base) {
      const runtime::Location at = runtime::locate(p);
      if (!at.base || cudaIpcGetMemHandle(&handle, const_cast<void*>(at.base)) != cudaSuccess) {
        cudaGetLastError();  // not shareable (cudaMallocAsync pools, ...): staged instead
        return false;
      }
      offset = static_cast<std::uint64_t>(static_cast<const std::byte*>(p) - static_cast<const std::byte*>(at.base));
      base = at.base;
      return true;
    };
    const void* send_base = nullptr;
    const void* recv_base = nullptr;
    out.has_send = send_elements(op, rank, size) > 0 ? 1 : 0;
    out.has_recv = recv_elements(op, rank, size) > 0 ? 1 : 0;
    if (out.has_send && !share(op.send, out.send, out.send_offset, send_base)) return false;
    if (out.has_recv && !share(op.recv, out.recv, out.recv_offset, recv_base)) return false;
    out.same = out.has_send && out.has_recv && send_base == recv_base ? 1 : 0;
    return true;
  }

  std::shared_ptr<Shared> shared_;
  std::chrono::milliseconds timeout_;
  std::uint64_t tickets_ = 0;
};

}  // namespace

std::unique_ptr<DeviceStaging> make_device_staging(int device, std::chrono::milliseconds timeout) {
  return std::make_unique<CudaStaging>(device, timeout);
}

}  // namespace braid::comm
