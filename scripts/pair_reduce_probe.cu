// Issue 19's 2-rank target: a 256 MiB all_reduce at 0.5 x the
// device-to-device copy's bandwidth. Under MPS braid reaches 0.479, its kernel
// alone about 0.505: the two cross-process waits of each call (the event
// gate's, scripts/cuda_gate_probe.cu eventpong: 6.6 us each) take the rest.
// This probe asks whether waits inside the kernel cost less.
//
// Two processes share the GPU and do that all_reduce as braid's direct path
// does (comm/device.h): each maps the other's buffers (CUDA IPC) and reduces
// its half of both inputs into both outputs. Two ways to wait:
//   events: as the event gate: each call, the stream waits for the other
//           process's IPC event before the kernel (the other's input is
//           ready) and after it (the other's half is written); the hosts
//           only tell each other that the event is recorded;
//   flags:  the streams do not wait. Each block of a kernel waits for a
//           flag that the other process's kernel sets as it starts (a kernel
//           that has started has its stream's earlier work behind it), and
//           the kernel's last block waits until every block of the other's
//           has counted itself done. Each kernel has at most half the GPU's
//           resident blocks, so both fit at once (under MPS they run side
//           by side; without it the GPU time-slices and the waits are long).
// Also the kernel alone in one process (both halves, no waits) and the copy
// the ratios are taken against. Each way's outputs are checked in both
// processes, with the check queued on the stream right after the call, so a
// half the other process had not yet written counts as wrong. A wait that
// lasts 2 s gives up: the process says so and the probe exits 1.
// Built by scripts/gpu_kit.sh: nvcc -std=c++20 -I. -gencode=arch=compute_90,code=sm_90
// -o pair_reduce_probe scripts/pair_reduce_probe.cu
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "scripts/cuda_timing.h"
#include "scripts/probe_child.h"

namespace {

constexpr std::size_t kBytes = 256u << 20, kPacks = kBytes / sizeof(float4);
constexpr int kThreads = 256, kWarmup = 5, kCalls = 40;
constexpr unsigned long long kTimeoutNs = 2'000'000'000ull;

// In each process's device memory; the other process's kernels write
// `started` and `theirs_done`.
struct Flags {
  unsigned long long started;      // the other's kernel of this call has begun
  unsigned long long theirs_done;  // blocks of the other's kernels done, every call so far
  unsigned long long mine_done;    // blocks of this process's kernels done (finds the last)
  unsigned long long timed_out;    // the call whose wait gave up, or 0
};

struct Pair {
  const float4* in[2];  // rank 0's input, rank 1's: both ranks add them in this order
  float4* out[2];
  std::size_t begin, end;  // the packs this kernel reduces
};

__device__ bool wait_at_least(const volatile unsigned long long* v, unsigned long long target) {
  const unsigned long long start = globaltimer_ns();
  while (*v < target) {
    if (globaltimer_ns() - start > kTimeoutNs) return false;
    __nanosleep(32);  // every block polls this one word: not at full speed
  }
  __threadfence();
  return true;
}

template <bool kFlags>
__global__ void pair_reduce(Pair p, Flags* mine, Flags* theirs, unsigned long long call) {
  __shared__ bool go;
  if constexpr (kFlags) {
    if (threadIdx.x == 0) {
      atomicMax(&theirs->started, call);
      // Once a wait has given up, later calls do not wait again.
      go = *static_cast<volatile unsigned long long*>(&mine->timed_out) == 0 && wait_at_least(&mine->started, call);
      if (!go) atomicCAS(&mine->timed_out, 0ull, call);
    }
    __syncthreads();
    if (!go) return;
  }
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t q = p.begin + std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; q < p.end; q += stride) {
    const float4 u = p.in[0][q], v = p.in[1][q];
    const float4 r{u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w};
    p.out[0][q] = r;
    p.out[1][q] = r;
  }
  if constexpr (kFlags) {
    __syncthreads();  // every thread of the block has written
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(&theirs->theirs_done, 1ull);
      const unsigned long long all = call * gridDim.x;
      if (atomicAdd(&mine->mine_done, 1ull) + 1 == all && !wait_at_least(&mine->theirs_done, all))
        atomicCAS(&mine->timed_out, 0ull, call);
    }
  }
}

__host__ __device__ float value(std::size_t element, int rank) {
  return static_cast<float>((element * 7 + rank * 13) % 1024);
}

__global__ void fill(float4* x, int rank) {
  for (std::size_t q = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; q < kPacks;
       q += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t e = 4 * q;
    x[q] = float4{value(e, rank), value(e + 1, rank), value(e + 2, rank), value(e + 3, rank)};
  }
}

__global__ void count_wrong(const float4* x, unsigned long long* wrong) {
  for (std::size_t q = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; q < kPacks;
       q += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t e = 4 * q;
    const float4 v = x[q];
    if (v.x != value(e, 0) + value(e, 1) || v.y != value(e + 1, 0) + value(e + 1, 1) ||
        v.z != value(e + 2, 0) + value(e + 2, 1) || v.w != value(e + 3, 0) + value(e + 3, 1))
      atomicAdd(wrong, 1ull);
  }
}

// Between the two processes, in shared memory mapped before the fork.
struct Shared {
  cudaIpcMemHandle_t in[2], out[2], flags[2];
  cudaIpcEventHandle_t ready[2], done[2];
  std::atomic<unsigned long long> arrived;
  std::atomic<unsigned long long> issued_ready[2], issued_done[2];  // events mode: calls whose event is recorded
  double ms[2][2];                   // [way][rank]: the timed calls (way 0 events, 1 flags)
  unsigned long long wrong[2][2];    // [way][rank]: packs wrong in the checked call
  double copy_ms, alone_ms;
  int grid, resident;
};

bool ok(cudaError_t e, int rank, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("pair: rank %d: %s: %s\n", rank, what, cudaGetErrorString(e));
  return false;
}

// Waits for `*counter >= target`, at most 10 s (the other process may have failed).
bool wait_for(const std::atomic<unsigned long long>& counter, unsigned long long target, int rank, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (counter.load() < target) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::printf("pair: rank %d: the other process never reached %s\n", rank, what);
      return false;
    }
    std::this_thread::yield();
  }
  return true;
}

int run(int rank, Shared* s) {
  const int peer = 1 - rank;
  unsigned long long barriers = 0;
  auto barrier = [&](const char* what) {
    s->arrived.fetch_add(1);
    return wait_for(s->arrived, 2 * ++barriers, rank, what);
  };
  float4 *in = nullptr, *out = nullptr;
  Flags* flags = nullptr;
  unsigned long long* wrong = nullptr;
  cudaStream_t stream;
  cudaEvent_t ready, done, peer_ready, peer_done;
  const unsigned ev_flags = cudaEventDisableTiming | cudaEventInterprocess;
  if (!ok(cudaMalloc(&in, kBytes), rank, "cudaMalloc") || !ok(cudaMalloc(&out, kBytes), rank, "cudaMalloc") ||
      !ok(cudaMalloc(&flags, sizeof(Flags)), rank, "cudaMalloc") ||
      !ok(cudaMalloc(&wrong, sizeof(unsigned long long)), rank, "cudaMalloc") ||
      !ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), rank, "cudaStreamCreate") ||
      !ok(cudaEventCreateWithFlags(&ready, ev_flags), rank, "cudaEventCreate") ||
      !ok(cudaEventCreateWithFlags(&done, ev_flags), rank, "cudaEventCreate"))
    return 1;
  fill<<<1024, kThreads, 0, stream>>>(in, rank);
  cudaMemsetAsync(flags, 0, sizeof(Flags), stream);
  if (!ok(cudaStreamSynchronize(stream), rank, "filling the input") ||
      !ok(cudaIpcGetMemHandle(&s->in[rank], in), rank, "cudaIpcGetMemHandle") ||
      !ok(cudaIpcGetMemHandle(&s->out[rank], out), rank, "cudaIpcGetMemHandle") ||
      !ok(cudaIpcGetMemHandle(&s->flags[rank], flags), rank, "cudaIpcGetMemHandle") ||
      !ok(cudaIpcGetEventHandle(&s->ready[rank], ready), rank, "cudaIpcGetEventHandle") ||
      !ok(cudaIpcGetEventHandle(&s->done[rank], done), rank, "cudaIpcGetEventHandle"))
    return 1;
  if (!barrier("the handles")) return 1;
  void *peer_in = nullptr, *peer_out = nullptr, *peer_flags = nullptr;
  const unsigned lazy = cudaIpcMemLazyEnablePeerAccess;
  if (!ok(cudaIpcOpenMemHandle(&peer_in, s->in[peer], lazy), rank, "cudaIpcOpenMemHandle") ||
      !ok(cudaIpcOpenMemHandle(&peer_out, s->out[peer], lazy), rank, "cudaIpcOpenMemHandle") ||
      !ok(cudaIpcOpenMemHandle(&peer_flags, s->flags[peer], lazy), rank, "cudaIpcOpenMemHandle") ||
      !ok(cudaIpcOpenEventHandle(&peer_ready, s->ready[peer]), rank, "cudaIpcOpenEventHandle") ||
      !ok(cudaIpcOpenEventHandle(&peer_done, s->done[peer]), rank, "cudaIpcOpenEventHandle"))
    return 1;
  auto* theirs = static_cast<Flags*>(peer_flags);
  Pair whole{};
  whole.in[rank] = in;
  whole.in[peer] = static_cast<const float4*>(peer_in);
  whole.out[rank] = out;
  whole.out[peer] = static_cast<float4*>(peer_out);
  Pair half = whole;
  half.begin = rank * (kPacks / 2);
  half.end = half.begin + kPacks / 2;
  whole.begin = 0;
  whole.end = kPacks;

  if (rank == 0) {  // the copy and the kernel alone, while rank 1 waits
    int per_sm = 0, sms = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pair_reduce<true>, kThreads, 0);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    s->resident = per_sm * sms;
    s->grid = std::max(1, s->resident / 2);
    s->copy_ms = best_ms(stream, 6, [&] { cudaMemcpyAsync(out, in, kBytes, cudaMemcpyDeviceToDevice, stream); });
    s->alone_ms = best_ms(stream, 6, [&] { pair_reduce<false><<<s->resident, kThreads, 0, stream>>>(whole, flags, theirs, 0); });
    if (!ok(cudaStreamSynchronize(stream), rank, "the copy and the kernel alone")) return 1;
  }
  if (!barrier("the copy")) return 1;
  const int grid = s->grid;

  unsigned long long events_call = 0, flags_call = 0;
  auto call = [&](bool with_flags) {
    if (with_flags) {
      pair_reduce<true><<<grid, kThreads, 0, stream>>>(half, flags, theirs, ++flags_call);
      return true;
    }
    const unsigned long long k = ++events_call;
    cudaEventRecord(ready, stream);
    s->issued_ready[rank].store(k);
    if (!wait_for(s->issued_ready[peer], k, rank, "its ready event")) return false;
    cudaStreamWaitEvent(stream, peer_ready, 0);
    pair_reduce<false><<<grid, kThreads, 0, stream>>>(half, flags, theirs, 0);
    cudaEventRecord(done, stream);
    s->issued_done[rank].store(k);
    if (!wait_for(s->issued_done[peer], k, rank, "its done event")) return false;
    cudaStreamWaitEvent(stream, peer_done, 0);
    return true;
  };
  for (const bool with_flags : {false, true}) {
    const char* way = with_flags ? "flags" : "events";
    // One checked call: the outputs cleared (NaN) in both processes first.
    cudaMemsetAsync(out, 0xff, kBytes, stream);
    cudaMemsetAsync(wrong, 0, sizeof(unsigned long long), stream);
    if (!ok(cudaStreamSynchronize(stream), rank, "clearing") || !barrier("the cleared outputs")) return 1;
    if (!call(with_flags)) return 1;
    count_wrong<<<1024, kThreads, 0, stream>>>(out, wrong);
    unsigned long long n_wrong = 0;
    cudaMemcpyAsync(&n_wrong, wrong, sizeof n_wrong, cudaMemcpyDeviceToHost, stream);
    if (!ok(cudaStreamSynchronize(stream), rank, way)) return 1;
    s->wrong[with_flags][rank] = n_wrong;
    for (int i = 0; i < kWarmup; ++i)
      if (!call(with_flags)) return 1;
    if (!ok(cudaStreamSynchronize(stream), rank, way) || !barrier("the warm-up")) return 1;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i)
      if (!call(with_flags)) return 1;
    if (!ok(cudaStreamSynchronize(stream), rank, way)) return 1;
    s->ms[with_flags][rank] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    Flags f{};
    cudaMemcpy(&f, flags, sizeof f, cudaMemcpyDeviceToHost);
    if (f.timed_out != 0) {
      std::printf("pair: rank %d: %s: call %llu waited 2 s for the other process's kernel and gave up\n", rank, way,
                  f.timed_out);
      return 1;
    }
    if (!barrier("the timed calls")) return 1;
  }
  cudaIpcCloseMemHandle(peer_in);
  cudaIpcCloseMemHandle(peer_out);
  cudaIpcCloseMemHandle(peer_flags);
  return 0;
}

}  // namespace

// Both ranks in processes of their own, forked before anything touches CUDA;
// at most 60 s.
int main() {
  auto* s = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (s == MAP_FAILED) return 1;
  std::memset(static_cast<void*>(s), 0, sizeof(Shared));
  std::fflush(stdout);
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = fork();
    if (pids[rank] == 0) {
      const int r = run(rank, s);
      std::fflush(stdout);
      _exit(r);
    }
  }
  bool failed = false;
  for (const pid_t pid : pids) {
    bool killed = false;
    failed = !reap_within(pid, std::chrono::seconds(60), &killed) || failed;
    if (killed) std::printf("pair: a process gave no answer within 60 s\n");
  }
  if (failed) return 1;
  // Each way's busbw (bytes / time a call: n = 2) over the copy's (bytes / time).
  const double copy_us = 1000 * s->copy_ms, alone_us = 1000 * s->alone_ms;
  const double events_us = 1000 * std::max(s->ms[0][0], s->ms[0][1]) / kCalls;
  const double flags_us = 1000 * std::max(s->ms[1][0], s->ms[1][1]) / kCalls;
  std::printf("pair: 256 MiB f32 over 2 processes, %d calls, %d blocks a kernel (half of %d resident): copy %.1f us "
              "(%.0f GB/s); kernel alone %.1f us (%.3f x copy); event waits %.1f us a call (%.3f x copy); in-kernel "
              "flags %.1f us a call (%.3f x copy)\n",
              kCalls, s->grid, s->resident, copy_us, kBytes / (copy_us * 1e3), alone_us, copy_us / alone_us,
              events_us, copy_us / events_us, flags_us, copy_us / flags_us);
  bool right = true;
  for (int way = 0; way < 2; ++way)
    for (int rank = 0; rank < 2; ++rank)
      if (s->wrong[way][rank] != 0) {
        std::printf("pair: WRONG: %s: %llu packs of rank %d's output\n", way ? "in-kernel flags" : "event waits",
                    s->wrong[way][rank], rank);
        right = false;
      }
  if (!right) return 1;
  std::printf("pair: every checked output right\n");
  return 0;
}
