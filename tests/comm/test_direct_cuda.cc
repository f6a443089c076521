// The direct collectives on CUDA device memory (CUDA builds): every
// direct collective (comm/algorithms/<kind>_direct.cc) over device buffers
// that the ranks of one host map through the cuda_ipc transport, and that
// transport's refusal of forged region references.
//
// Needs a GPU: without one (this project's CI) each test says so and passes
// as skipped; scripts/gpu_check.sh runs them (test_comm_device). CUDA is
// only touched in forked processes, never in the test process itself.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/device.h"
#include "runtime/errors.h"
#include "runtime/store.h"
#include "tests/comm/cases.h"
#include "tests/comm/harness.h"
#include "tools/bench/verify.h"

using namespace braid;
using namespace braid::comm;
using braid::test::expect;
using namespace braid::test::cases;

namespace {

constexpr const char* kNoGpu = "skipped: no CUDA device (the CUDA code is built; the GPU checks run on a machine with one)";

// GPUs visible to a fresh process (0 when there is no driver or device).
int probe_gpus() {
  pid_t child = fork();
  if (child == 0) {
    int count = 0;
    _exit(cudaGetDeviceCount(&count) == cudaSuccess ? count : 0);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

void cuda(cudaError_t status, const std::string& what) {
  expect(status == cudaSuccess, "CUDA " + what + ": " + cudaGetErrorString(status));
}

// Device memory from cudaMalloc (shareable through CUDA IPC) or from the
// stream-ordered allocator (which IPC cannot share: calls on it are staged).
struct DeviceBuffer {
  DeviceBuffer(std::size_t bytes, bool shareable) : shareable(shareable) {
    if (shareable) cuda(cudaMalloc(&data, bytes), "cudaMalloc");
    else cuda(cudaMallocAsync(&data, bytes, nullptr), "cudaMallocAsync"), cuda(cudaDeviceSynchronize(), "sync");
  }
  ~DeviceBuffer() {
    if (shareable) cudaFree(data);
    else cudaFreeAsync(data, nullptr), cudaDeviceSynchronize();
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::byte* bytes() const { return static_cast<std::byte*>(data); }
  void* data = nullptr;
  bool shareable;
};

Work issue(Communicator& comm, const Case& c, const void* in, void* out, Stream s) {
  switch (c.kind) {
    case OpKind::all_reduce: return comm.all_reduce(in, out, c.count, c.dtype, c.op, s);
    case OpKind::reduce_scatter: return comm.reduce_scatter(in, out, c.count, c.dtype, c.op, s);
    case OpKind::all_gather: return comm.all_gather(in, out, c.count, c.dtype, s);
    case OpKind::broadcast: return comm.broadcast(in, out, c.count, c.dtype, c.root, s);
    case OpKind::reduce: return comm.reduce(in, out, c.count, c.dtype, c.op, c.root, s);
    default: return comm.all_to_all(in, out, c.count, c.dtype, s);
  }
}

const std::byte* expected(const verify::ExpectedTable& table, const Case& c, int r, std::size_t i) {
  switch (c.kind) {
    case OpKind::all_reduce:
    case OpKind::reduce: return table.reduction(i);
    case OpKind::reduce_scatter: return table.reduction(r * c.count + i);
    case OpKind::all_gather: return table.input(int(i / c.count), i % c.count);
    case OpKind::broadcast: return table.input(c.root, i);
    default: return table.input(int(i / c.count), r * c.count + i % c.count);  // all_to_all
  }
}

// One case on device buffers `send` and `recv` (each of at least the
// largest case), on stream `s`: the input is uploaded, the call issued and
// the output downloaded on the stream, with no Work::wait; the output must
// be exact, and the call run direct (cuda_ipc) or staged as `direct` says,
// and a direct one by one worker (rank 0 doing every rank's share) or by
// all as `one_worker` says.
void run_case(Communicator& comm, const Case& c, DeviceBuffer& send, DeviceBuffer& recv, cudaStream_t s,
              bool direct, bool one_worker) {
  const int n = comm.size(), r = comm.rank();
  const std::size_t es = dtype_bytes(c.dtype), count = c.count, big = per_rank(c.kind) ? count * n : count;
  std::vector<std::byte> host_in(std::max<std::size_t>(1, big) * es), host_out(host_in.size());
  std::byte* in = send.bytes();
  std::byte* out = recv.bytes();
  if (c.in_place) {
    in = c.kind == OpKind::all_gather ? recv.bytes() + r * count * es : recv.bytes();
    out = c.kind == OpKind::reduce_scatter ? recv.bytes() + r * count * es : recv.bytes();
  }
  const std::size_t fill = c.kind == OpKind::all_gather ? count : big;
  verify::fill_input(host_in.data(), fill, 0, r, n, c.dtype, c.op);
  cuda(cudaMemsetAsync(recv.data, 0, big * es, s), "memset");
  cuda(cudaMemcpyAsync(in, host_in.data(), fill * es, cudaMemcpyHostToDevice, s), "upload");
  const auto before = comm.traffic();
  issue(comm, c, in, out, Stream{s});
  const std::size_t out_elems = c.kind == OpKind::reduce_scatter ? count : big;
  cuda(cudaMemcpyAsync(host_out.data(), out, out_elems * es, cudaMemcpyDeviceToHost, s), "download");
  cuda(cudaStreamSynchronize(s), "sync");
  const std::string ran = comm.last_algorithm(c.kind).name;
  expect((ran == "cuda_ipc") == direct, describe(c, n) + " ran " + ran + (direct ? ", not" : ", yet not") +
                                          " direct on device buffers IPC " + (send.shareable ? "shares" : "cannot share"));
  if (ran == "cuda_ipc") {
    expect(comm.traffic().bytes_sent - before.bytes_sent < 512u * static_cast<unsigned>(n),
           describe(c, n) + " moved its data through the transport: not direct");
    const bool one = comm.last_algorithm(c.kind).reason.find("one worker") != std::string::npos;
    expect(one == one_worker, describe(c, n) + (one_worker ? " ran with all workers, not one" : " ran with one worker"));
  }
  if (c.kind == OpKind::reduce && r != c.root) return;
  verify::ExpectedTable table(n, c.dtype, c.op);
  for (std::size_t i = 0; i < out_elems; ++i)
    if (std::memcmp(host_out.data() + i * es, expected(table, c, r, i), es) != 0)
      expect(false, "wrong element " + std::to_string(i) + " in " + describe(c, n) + " (" + ran + ")");
}

constexpr std::size_t kMaxCount = 100003;

std::vector<Case> grid(int size, std::span<const DataType> dtypes) {
  std::vector<Case> cases;
  const std::size_t counts[] = {1, 1009, static_cast<std::size_t>(size) * 37 + 1, kMaxCount};
  for (DataType dtype : dtypes)
    for (std::size_t count : counts)
      for (bool in_place : {false, true}) {
        const int root = static_cast<int>(count % size);
        for (OpKind kind : {OpKind::all_reduce, OpKind::reduce_scatter, OpKind::reduce})
          for (ReduceOp op : kOps) cases.push_back({kind, dtype, op, count, in_place, root});
        if (!is_floating(dtype))  // the bitwise operators, of the integer types (CUDA's BitAnd, ...)
          for (OpKind kind : {OpKind::all_reduce, OpKind::reduce_scatter, OpKind::reduce})
            for (ReduceOp op : {ReduceOp::band, ReduceOp::bor, ReduceOp::bxor})
              cases.push_back({kind, dtype, op, count, in_place, root});
        for (OpKind kind : {OpKind::all_gather, OpKind::broadcast, OpKind::all_to_all})
          cases.push_back({kind, dtype, ReduceOp::sum, count, in_place, root});
      }
  return cases;
}

// GPUs visible to a rank.
int gpu_count() {
  int gpus = 0;
  cuda(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
  return gpus;
}

// Rank r on GPU r mod the GPU count, with a stream of its own.
cudaStream_t rank_stream(int rank) {
  cuda(cudaSetDevice(rank % gpu_count()), "cudaSetDevice");
  cudaStream_t s;
  cuda(cudaStreamCreate(&s), "cudaStreamCreate");
  return s;
}

// Whether this process reaches device 0 through MPS (BRAID_DIRECT_WORKERS
// auto is then all).
bool under_mps() {
  int mps = 0;
  if (cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return mps != 0;
}

// Every case of the grid on buffers from `shareable` memory, each run
// direct when `direct` (but an in-place all_to_all, which never is), by one
// worker when `one_worker`; by default, as BRAID_DIRECT_WORKERS=auto does:
// one where every rank is on the same GPU, unless under MPS.
void sweep(Communicator& comm, bool shareable, bool direct, std::span<const DataType> dtypes = kDtypes,
           std::optional<bool> one_worker = std::nullopt) {
  cudaStream_t s = rank_stream(comm.rank());
  {
    const std::size_t bytes = kMaxCount * static_cast<std::size_t>(comm.size()) * 8;
    DeviceBuffer send(bytes, shareable), recv(bytes, shareable);
    const bool one = one_worker.value_or(gpu_count() == 1 && !under_mps());
    for (const Case& c : grid(comm.size(), dtypes))
      run_case(comm, c, send, recv, s, direct && !(c.kind == OpKind::all_to_all && c.in_place),
               one);
  }
  cuda(cudaStreamDestroy(s), "cudaStreamDestroy");
}

}  // namespace

TEST_CASE("cuda_ipc: every direct collective on device buffers, every dtype, op, count and placement",
          "[device][cuda_ipc]") {
  if (probe_gpus() == 0) {
    WARN(kNoGpu);
    return;
  }
  for (int n : {2, 3, 4}) {
    auto result = test::run_ranks(n, [](Communicator& comm) { sweep(comm, true, true); },
                                  test::run_options(std::chrono::seconds(300), test::test_config()));
    INFO(n << " ranks: " << result.summary());
    CHECK(result.all_ok());
  }
  // Each rank its own share, as on ranks of different GPUs.
  constexpr DataType dtypes[] = {DataType::f32, DataType::bf16, DataType::i32};
  runtime::Config config = test::test_config();
  config.direct_workers = "all";
  auto all = test::run_ranks(3, [&](Communicator& comm) { sweep(comm, true, true, dtypes, false); },
                             test::run_options(std::chrono::seconds(300), config));
  INFO("BRAID_DIRECT_WORKERS=all: " << all.summary());
  CHECK(all.all_ok());
}

// Holds `stream` with a host function until a timer thread releases it
// after `hold`: not the caller's thread, which a call run inline (gate
// `host`) may block while the stream is held.
class StreamHold {
 public:
  StreamHold(cudaStream_t stream, std::chrono::milliseconds hold) {
    cuda(cudaLaunchHostFunc(stream, [](void* flag) {
      while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }, &release_), "cudaLaunchHostFunc");
    releaser_ = std::thread([this, hold] {
      std::this_thread::sleep_for(hold);
      release_ = true;
    });
  }
  ~StreamHold() { join(); }
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;
  void join() {
    if (releaser_.joinable()) releaser_.join();
  }

 private:
  std::atomic<bool> release_{false};
  std::thread releaser_;
};

// `body` on 2 ranks under each gate that may let the host run ahead of the
// GPU (event, flag) and under `host`.
void under_each_gate(const std::function<void(Communicator&)>& body) {
  for (const char* gate : {"event", "flag", "host"}) {
    runtime::Config config = test::test_config();
    config.cuda_gate = gate;
    auto result = test::run_ranks(2, body, test::run_options(std::chrono::seconds(120), config));
    INFO("BRAID_CUDA_GATE=" << gate << ": " << result.summary());
    CHECK(result.all_ok());
  }
}

// More allocations than a rank keeps its peers' mappings of (PeerRegions'
// kMaxOpen, 64), each reduced in place by a call queued behind the one
// before, with nothing waited on between: under the gates that let the
// host run ahead of the GPU (event, flag) a mapping evicted by a later
// call may still be read by an earlier call's queued kernel. Each rank's
// stream is held while the host issues them all. Each buffer's sum must be exact, and nothing may fault.
// A helper's reading of the code found that eviction closed a mapping
// under queued kernels (the driver's documentation does not say whether
// cudaIpcCloseMemHandle waits for them); PeerRegions now waits for an event
// recorded after them (cuda_ipc/memory.h). Not run on a GPU yet.
TEST_CASE("cuda_ipc: calls queued on more allocations than stay mapped keep their peers' memory mapped",
          "[device][cuda_ipc]") {
  if (probe_gpus() == 0) {
    WARN(kNoGpu);
    return;
  }
  under_each_gate([](Communicator& comm) {
    cudaStream_t s = rank_stream(comm.rank());
    constexpr int kBuffers = 160;
    constexpr std::size_t kCount = 1 << 16;
    std::vector<std::unique_ptr<DeviceBuffer>> buffers;
    std::vector<std::vector<float>> host(kBuffers, std::vector<float>(kCount));
    for (int b = 0; b < kBuffers; ++b) {
      buffers.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float), true));
      for (std::size_t i = 0; i < kCount; ++i) host[b][i] = float((b * 7 + i) % 1000 + comm.rank());
      cuda(cudaMemcpy(buffers[b]->data, host[b].data(), kCount * sizeof(float), cudaMemcpyHostToDevice), "upload");
    }
    // The stream is held for 2 s, so that every call is issued, and every
    // eviction made, before any of their kernels can run.
    StreamHold hold(s, std::chrono::seconds(2));
    for (int b = 0; b < kBuffers; ++b)
      comm.all_reduce(buffers[b]->data, buffers[b]->data, kCount, DataType::f32, ReduceOp::sum, Stream{s});
    hold.join();
    cuda(cudaStreamSynchronize(s), "the queued calls");
    std::vector<float> out(kCount);
    for (int b = 0; b < kBuffers; ++b) {
      cuda(cudaMemcpy(out.data(), buffers[b]->data, kCount * sizeof(float), cudaMemcpyDeviceToHost), "download");
      for (std::size_t i = 0; i < kCount; ++i)
        if (out[i] != float(2 * ((b * 7 + i) % 1000) + 1))
          expect(false, "buffer " + std::to_string(b) + " element " + std::to_string(i) + ": " +
                            std::to_string(out[i]) + " (" + comm.last_algorithm(OpKind::all_reduce).name + ")");
    }
    expect(comm.last_algorithm(OpKind::all_reduce).name == "cuda_ipc", "the all_reduce did not run direct");
    cuda(cudaStreamDestroy(s), "cudaStreamDestroy");
  });
}

// A rank's calls on two streams: all_reduce N on stream X, whose input is
// written on X behind a hold (rank 1's longer than rank 0's), then N+1 on
// stream Y, ready at once. The flag gate's flags say only "this rank's
// stream has reached call N or later": had N+1 run ahead on Y, its flag
// would have let rank 0's N read rank 1's input before it was written. A
// rank's calls run in issue order on the GPU under every gate, so both sums
// are exact. Not run on a GPU yet (a review helper's reading of the code).
TEST_CASE("cuda_ipc: a rank's calls on two streams run in issue order under every gate", "[device][cuda_ipc]") {
  if (probe_gpus() == 0) {
    WARN(kNoGpu);
    return;
  }
  under_each_gate([](Communicator& comm) {
    constexpr std::size_t kCount = 1 << 18;
    cudaStream_t x = rank_stream(comm.rank()), y = rank_stream(comm.rank());
    DeviceBuffer a(kCount * sizeof(float), true), b(kCount * sizeof(float), true);
    const std::vector<float> garbage(kCount, -1e6f), b_in(kCount, float(10 + comm.rank()));
    cuda(cudaMemcpy(a.data, garbage.data(), kCount * sizeof(float), cudaMemcpyHostToDevice), "upload");
    cuda(cudaMemcpy(b.data, b_in.data(), kCount * sizeof(float), cudaMemcpyHostToDevice), "upload");
    float* a_in = nullptr;  // pinned, so that the copy on x is queued, not done now
    cuda(cudaMallocHost(&a_in, kCount * sizeof(float)), "cudaMallocHost");
    std::fill(a_in, a_in + kCount, float(1 + comm.rank()));
    StreamHold hold(x, std::chrono::milliseconds(comm.rank() == 0 ? 500 : 2000));
    cuda(cudaMemcpyAsync(a.data, a_in, kCount * sizeof(float), cudaMemcpyHostToDevice, x), "the held upload");
    comm.all_reduce(a.data, a.data, kCount, DataType::f32, ReduceOp::sum, Stream{x});
    comm.all_reduce(b.data, b.data, kCount, DataType::f32, ReduceOp::sum, Stream{y});
    hold.join();
    cuda(cudaStreamSynchronize(x), "stream x");
    cuda(cudaStreamSynchronize(y), "stream y");
    std::vector<float> out(kCount);
    for (auto [buffer, want, what] : {std::tuple{&a, 3.0f, "call N on x"}, std::tuple{&b, 21.0f, "call N+1 on y"}}) {
      cuda(cudaMemcpy(out.data(), buffer->data, kCount * sizeof(float), cudaMemcpyDeviceToHost), "download");
      for (std::size_t i = 0; i < kCount; ++i)
        if (out[i] != want) {
          expect(false, std::string(what) + ": element " + std::to_string(i) + " is " + std::to_string(out[i]) +
                            ", not " + std::to_string(want) + " (" + comm.last_algorithm(OpKind::all_reduce).name +
                            ")");
          break;
        }
    }
    cudaFreeHost(a_in);
    cuda(cudaStreamDestroy(x), "cudaStreamDestroy");
    cuda(cudaStreamDestroy(y), "cudaStreamDestroy");
  });
}

// The same grid where the direct path must not run, with the same results:
// buffers CUDA IPC cannot share (the stream-ordered allocator), and
// BRAID_TRANSPORT=shm (which turns cuda_ipc off).
TEST_CASE("cuda_ipc: calls it cannot take are staged, with the same results", "[device][cuda_ipc]") {
  if (probe_gpus() == 0) {
    WARN(kNoGpu);
    return;
  }
  constexpr DataType dtypes[] = {DataType::f32, DataType::i32};
  auto unshareable = test::run_ranks(2, [&](Communicator& comm) { sweep(comm, false, false, dtypes); },
                                     test::run_options(std::chrono::seconds(300), test::test_config()));
  INFO("cudaMallocAsync buffers: " << unshareable.summary());
  CHECK(unshareable.all_ok());
  runtime::Config config = test::test_config();
  config.transport = "shm";
  auto forced_shm = test::run_ranks(3, [&](Communicator& comm) { sweep(comm, true, false, dtypes); },
                                    test::run_options(std::chrono::seconds(300), config));
  INFO("BRAID_TRANSPORT=shm: " << forced_shm.summary());
  CHECK(forced_shm.all_ok());
}

// One rank's buffers IPC can share, the other's not: one rank goes direct,
// the other is staged; both must fail, naming the call, well within the
// timeout, and never hang.
TEST_CASE("cuda_ipc: direct on one rank and staged on another fails on both, naming the call",
          "[device][cuda_ipc]") {
  if (probe_gpus() == 0) {
    WARN(kNoGpu);
    return;
  }
  auto result = test::run_ranks(2, [](Communicator& comm) {
    cudaStream_t s = rank_stream(comm.rank());
    DeviceBuffer buffer(1 << 20, comm.rank() == 0);
    comm.all_reduce(buffer.data, buffer.data, 1 << 18, DataType::f32, ReduceOp::sum, Stream{s}).wait();
    cuda(cudaStreamSynchronize(s), "sync");
    expect(false, "an all_reduce direct on one rank and staged on the other completed");
  }, test::run_options(std::chrono::seconds(60), test::test_config(std::chrono::seconds(20))));
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  for (const auto& rank : result.ranks) CHECK(rank.exit_code == 1);
  CHECK_THAT(result.summary(), Catch::Contains("all_reduce"));
}

namespace {

// Runs fn(rank, store) in `size` forked processes that share a store served
// by this process, under `deadline` (then SIGKILL). Returns each rank's
// failure message, empty for a rank that succeeded.
std::vector<std::string> fork_with_store(int size, const std::function<void(int, runtime::Store&)>& fn,
                                         std::chrono::seconds deadline) {
  const std::string token = "cuda-ipc-test-" + std::to_string(getpid());
  runtime::StoreServer server("127.0.0.1", 0, token);
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  std::fflush(nullptr);
  for (int rank = 0; rank < size; ++rank) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      std::string message;
      try {
        auto store = std::make_shared<runtime::Store>("127.0.0.1", server.port(), token, std::chrono::seconds(20));
        fn(rank, *store);
      } catch (const std::exception& e) {
        message = e.what();
        if (message.empty()) message = "failed";
      }
      (void)!write(fds[1], message.data(), message.size());
      _exit(message.empty() ? 0 : 1);
    }
    close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  std::vector<std::string> failures(static_cast<std::size_t>(size));
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (int rank = 0; rank < size; ++rank) {
    int status = 0;
    while (waitpid(pids[rank], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > end) {
        for (pid_t pid : pids) kill(pid, SIGKILL);
        waitpid(pids[rank], &status, 0);
        failures[rank] = "killed at the deadline";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    char text[4096];
    const ssize_t got = read(pipes[rank], text, sizeof text);
    if (got > 0) failures[rank] += std::string(text, static_cast<std::size_t>(got));
    else if (failures[rank].empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) failures[rank] = "died";
    close(pipes[rank]);
  }
  return failures;
}

// cuda_ipc between ranks 0 and 1, made as the communicator makes it: by the
// device path of the current device (comm/device.h), where the CUDA code is.
std::unique_ptr<Transport> ipc_transport(int rank, std::shared_ptr<runtime::Store> store) {
  cuda_ipc::CudaIpcOptions options;
  options.rank = rank;
  options.size = 2;
  options.local_ranks = {0, 1};
  int device = 0;
  cuda(cudaGetDevice(&device), "cudaGetDevice");
  return make_device_staging(device, std::chrono::seconds(60), "kernel")->connect_regions(std::move(store), "test/cuda_ipc",
                                                                                options);
}

// Rank 1 of the forged-reference test: shares 1 MiB holding i % 251 at byte
// i, hands rank 0 a reference to bytes [100, 1100), waits until it is done.
void share_region(runtime::Store& store) {
  std::shared_ptr<runtime::Store> shared(&store, [](runtime::Store*) {});
  cuda(cudaSetDevice(0), "cudaSetDevice");
  std::vector<std::uint8_t> pattern(1u << 20);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::uint8_t>(i % 251);
  void* base = nullptr;
  cuda(cudaMalloc(&base, pattern.size()), "cudaMalloc");
  cuda(cudaMemcpy(base, pattern.data(), pattern.size(), cudaMemcpyHostToDevice), "upload");
  auto ipc = ipc_transport(1, shared);
  RegionRef ref, past;
  expect(ipc->find_region(static_cast<std::byte*>(base) + 100, 1000, ref), "cudaMalloc memory was not shareable");
  expect(!ipc->find_region(static_cast<std::byte*>(base) + 100, 64u << 20, past), "a range past the allocation was");
  runtime::Bytes bytes(sizeof ref);
  std::memcpy(bytes.data(), &ref, sizeof ref);
  store.set("test/ref", bytes);
  store.get("test/done", std::chrono::seconds(60));
  ipc.reset();
  cudaFree(base);
}

// InvalidUsage whose text has `words`, from `call`.
void expect_refusal(const std::function<void()>& call, const std::string& words) {
  try {
    call();
  } catch (const InvalidUsage& e) {
    expect(std::string(e.what()).find(words) != std::string::npos, std::string("refused, but with: ") + e.what());
    return;
  }
  expect(false, "not refused: " + words);
}

// Rank 0: what cuda_ipc refuses by name (messages, host memory, mapping
// before sharing or from a rank that is not a peer), then maps the
// reference, reads the pattern through it, and sees every forged variant
// refused with an error naming rank 1.
void map_forged(runtime::Store& store) {
  std::shared_ptr<runtime::Store> shared(&store, [](runtime::Store*) {});
  int gpus = 0;
  cuda(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
  cuda(cudaSetDevice(gpus > 1 ? 1 : 0), "cudaSetDevice");
  void* own = nullptr;
  cuda(cudaMalloc(&own, 4096), "cudaMalloc");
  auto ipc = ipc_transport(0, shared);
  RegionRef mine, ref;
  expect_refusal([&] { ipc->map_region(1, ref); }, "before sharing any of its own");
  std::vector<float> host(1024);
  expect(!ipc->find_region(host.data(), 4096, mine), "host memory was found as a device region");
  expect_refusal([&] { ipc->post_send(1, WireHeader{}, host.data()); }, "carries no messages");
  expect(ipc->find_region(own, 4096, mine), "cudaMalloc memory was not shareable");
  const runtime::Bytes bytes = store.get("test/ref", std::chrono::seconds(60));
  std::memcpy(&ref, bytes.data(), sizeof ref);
  std::span<std::byte> span = ipc->map_region(1, ref);
  std::vector<std::uint8_t> seen(span.size());
  cuda(cudaMemcpy(seen.data(), span.data(), span.size(), cudaMemcpyDeviceToHost), "download");
  for (std::size_t i = 0; i < seen.size(); ++i)
    expect(seen[i] == (100 + i) % 251, "the mapped region reads wrong at byte " + std::to_string(i));
  auto refused = [&](RegionRef bad, const std::string& words) {
    try {
      ipc->map_region(1, bad);
    } catch (const RemoteError& e) {
      const std::string text = e.what();
      expect(e.peer() == 1 && text.find("rank 1") != std::string::npos && text.find(words) != std::string::npos,
             "refused, but with: " + text);
      return;
    }
    expect(false, "a forged reference (" + words + ") was mapped");
  };
  RegionRef past = ref, huge = ref, unknown = ref, odd = ref;
  past.offset = 64u << 20;
  huge.bytes = ~std::uint64_t{0} - 50;
  unknown.key[0] += 1000;
  odd.key[1] = 1;
  refused(past, "checked against what it registered");
  refused(huge, "checked against what it registered");
  refused(unknown, "has not registered");
  refused(odd, "impossible key");
  expect_refusal([&] { ipc->map_region(0, ref); }, "not a peer on this host");
  expect_refusal([&] { ipc->map_region(3, ref); }, "not a peer on this host");
  store.set("test/done", "1");
  ipc.reset();
  cudaFree(own);
}

}  // namespace

TEST_CASE("cuda_ipc: a peer's region reference is checked against what it registered", "[device][cuda_ipc]") {
  if (probe_gpus() == 0) {
    WARN(kNoGpu);
    return;
  }
  auto failures = fork_with_store(2, [](int rank, runtime::Store& store) {
    if (rank == 1) share_region(store);
    else map_forged(store);
  }, std::chrono::seconds(120));
  INFO("rank 0: " << failures[0] << "\nrank 1: " << failures[1]);
  CHECK(failures[0].empty());
  CHECK(failures[1].empty());
}

// The device path's entry (comm/device_loader.cc -> libbraid_comm_cuda.so),
// with or without a GPU: a gate mode that is none of the modes is
// refused by name; "kernel" gives the staging on a GPU, and without one a
// SystemError that says there is no usable device. So the plugin loads and
// its factory takes the arguments the loader passes, also on machines
// (this project's CI) that never run the tests above.
TEST_CASE("device path: the CUDA plugin loads, refuses a bad gate mode and says when there is no GPU",
          "[device]") {
  const bool gpu = probe_gpus() > 0;
  auto failures = fork_with_store(1, [gpu](int, runtime::Store&) {
    expect_refusal([] { make_device_staging(0, std::chrono::seconds(5), "spinning"); },
                   "choose auto, kernel, wait, host, event or flag");
    try {
      auto staging = make_device_staging(0, std::chrono::seconds(5), "kernel");
      expect(gpu && staging != nullptr, "a device staging without a GPU");
    } catch (const SystemError& e) {
      expect(!gpu, std::string("no staging on a GPU: ") + e.what());
      expect(std::string(e.what()).find("no usable CUDA device") != std::string::npos,
             std::string("without a GPU, but: ") + e.what());
    }
  }, std::chrono::seconds(60));
  INFO(failures[0]);
  CHECK(failures[0].empty());
}
