// Issue 19's targets for ranks sharing one GPU: a 256 MiB all_reduce's busbw
// at 0.5 x the device-to-device copy's bandwidth on 2 ranks, at 0.375 (the
// traffic's bound) on 4. Under MPS braid reaches 0.479 and 0.361, its 2-rank
// kernel alone about 0.505: the cross-process waits of each call (the event
// gate's, scripts/cuda_gate_probe.cu eventpong: 6.6 us each) take the rest.
// This probe asks whether waits inside the kernel cost less. (Its answer,
// H200 under MPS: flags inside the kernel 0.476 at best, since such a kernel
// gets only the resident grid, on which the reduction itself is 7 % slower;
// one-thread flag kernels around the fast kernel 0.505, which braid's gate
// `flag` now does: comm/device.h.)
//
// n processes share the GPU and do that all_reduce as braid's direct path
// does (comm/device.h): each maps the others' buffers (CUDA IPC) and reduces
// its 1/n of every input into every output, with each of several kernel
// bodies (kVariants: packs a thread a step, cache hints). Seven ways to wait:
//   events: as the event gate: each call, the stream waits for every other
//           process's IPC event before the kernel (their inputs are ready)
//           and after it (their shares are written); the hosts only tell
//           each other that the events are recorded;
//   flags:  the streams do not wait. Each block of a kernel waits for flags
//           that the other processes' kernels set as they start (a kernel
//           that has started has its stream's earlier work behind it), and
//           the kernel's last block waits until every block of the others'
//           has counted itself done. Each kernel has at most 1/n of the
//           GPU's resident blocks, so that all fit at once (under MPS they run
//           side by side; without it the GPU time-slices and the waits are long).
//   flags via a worker: as flags, with the kernel on a second stream of the
//           process (as braid's Reducer runs the steps on its own stream):
//           that stream waits for the caller's (an event of the process)
//           and the caller's waits for it after the kernel. What those two
//           hops cost tells whether a gate with waits in the kernel could
//           keep braid's worker streams or must run on the caller's;
//   event waits, one pack a thread: as events, with the kernel on as many
//           blocks as it has packs (braid's reduce_multi's grid);
//   flag kernels around one pack a thread: the streams do not wait; a
//           one-thread kernel before that kernel tells the others "my
//           stream is here" and waits for theirs, and one after it tells
//           them "my share is written" and waits for theirs (no kernel
//           needs another's blocks resident);
//   with braid's two records: as flag kernels, with an event recorded on
//           the stream before the first and one after the last, as braid's
//           gate `flag` records `staged` and `finished` each call;
//   and its hosts' swap: as that, each call queued only once every
//           process's host has reached it (braid swaps the ranks' call
//           numbers before it queues a call's kernels).
// The last three against each other tell what braid's 2-rank call costs
// beyond these kernels and waits, and where (stop 41: 267-268 us, with
// flag kernels 262-268 in the same session).
// Also the kernel alone in one process (every share, no waits) and the copy
// the ratios are taken against. Each way's outputs are checked in every
// process, with the check queued on the stream right after the call, so a
// share another process had not yet written counts as wrong. A wait that
// lasts 2 s gives up: the process says so and the probe exits 1.
// Usage: allreduce_wait_probe [RANKS...] (default 2 4; 2..8 each).
// Built by scripts/gpu_kit.sh: nvcc -std=c++20 -I. -gencode=arch=compute_90,code=sm_90
// -o allreduce_wait_probe scripts/allreduce_wait_probe.cu
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "scripts/cuda_timing.h"
#include "scripts/probe_child.h"

namespace {

constexpr int kMaxRanks = 8;
constexpr std::size_t kBytes = 256u << 20, kPacks = kBytes / sizeof(float4);
constexpr int kThreads = 256, kWarmup = 5, kCalls = 40;
constexpr unsigned long long kTimeoutNs = 2'000'000'000ull;

enum Way { kEvents, kFlags, kFlagsWorker, kEventsFull, kFlagKernels, kFlagRecords, kFlagHosts, kWays };
const char* const kWayNames[kWays] = {"event waits",
                                      "in-kernel flags",
                                      "in-kernel flags via a worker stream",
                                      "event waits, one pack a thread",
                                      "flag kernels around one pack a thread",
                                      "with braid's two records",
                                      "and its hosts' swap"};

// In each process's device memory; the other processes' kernels write
// `started` and `theirs_done`.
struct Flags {
  unsigned long long started[kMaxRanks];  // [r]: rank r's kernel of this call has begun
  unsigned long long theirs_done;         // blocks of the others' kernels done, every call so far
  unsigned long long mine_done;           // blocks of this process's kernels done (finds the last)
  unsigned long long timed_out;           // the call whose wait gave up, or 0
  // The flag kernels' (one block each, before and after the reduce kernel):
  unsigned long long begun[kMaxRanks];  // [r]: rank r's stream has reached this call
  unsigned long long ended;             // calls whose shares the others have written, summed over them
};

struct Ranks {
  const float4* in[kMaxRanks];  // by rank: every process adds them in this order
  float4* out[kMaxRanks];
  Flags* flags[kMaxRanks];
  int n, rank;
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

// The kernel's body, kUnroll packs a thread a step (a grid's stride apart,
// all loaded before any is added), with streaming cache hints or without.
template <int kUnroll, bool kStreaming>
__device__ void reduce_share(const Ranks& p) {
  auto load = [](const float4* q) { return kStreaming ? __ldcs(q) : *q; };
  auto store = [](float4* q, float4 v) {
    if constexpr (kStreaming) __stcs(q, v);
    else *q = v;
  };
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t q = p.begin + std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; q + (kUnroll - 1) * stride < p.end; q += kUnroll * stride) {
    float4 acc[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc[u] = load(p.in[0] + q + u * stride);
    for (int r = 1; r < p.n; ++r) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = load(p.in[r] + q + u * stride);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        acc[u] = float4{acc[u].x + v[u].x, acc[u].y + v[u].y, acc[u].z + v[u].z, acc[u].w + v[u].w};
    }
    for (int r = 0; r < p.n; ++r)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) store(p.out[r] + q + u * stride, acc[u]);
  }
  for (; q < p.end; q += stride) {
    float4 acc = load(p.in[0] + q);
    for (int r = 1; r < p.n; ++r) {
      const float4 v = load(p.in[r] + q);
      acc = float4{acc.x + v.x, acc.y + v.y, acc.z + v.z, acc.w + v.w};
    }
    for (int r = 0; r < p.n; ++r) store(p.out[r] + q, acc);
  }
}

template <bool kFlags, int kUnroll, bool kStreaming>
__global__ void share_reduce(Ranks p, unsigned long long call) {
  __shared__ bool go;
  Flags* mine = p.flags[p.rank];
  if constexpr (kFlags) {
    if (threadIdx.x == 0) {
      for (int r = 0; r < p.n; ++r)
        if (r != p.rank) atomicMax(&p.flags[r]->started[p.rank], call);
      // Once a wait has given up, later calls do not wait again.
      go = *static_cast<volatile unsigned long long*>(&mine->timed_out) == 0;
      for (int r = 0; r < p.n && go; ++r)
        if (r != p.rank) go = wait_at_least(&mine->started[r], call);
      if (!go) atomicCAS(&mine->timed_out, 0ull, call);
    }
    __syncthreads();
    if (!go) return;
  }
  reduce_share<kUnroll, kStreaming>(p);
  if constexpr (kFlags) {
    __syncthreads();  // every thread of the block has written
    if (threadIdx.x == 0) {
      __threadfence();
      for (int r = 0; r < p.n; ++r)
        if (r != p.rank) atomicAdd(&p.flags[r]->theirs_done, 1ull);
      const unsigned long long mine_all = call * gridDim.x, theirs_all = mine_all * (p.n - 1);
      if (atomicAdd(&mine->mine_done, 1ull) + 1 == mine_all && !wait_at_least(&mine->theirs_done, theirs_all))
        atomicCAS(&mine->timed_out, 0ull, call);
    }
  }
}

// The flag kernels: one thread, on the stream before and after a reduce
// kernel of any grid (no kernel needs another's blocks resident).
__global__ void flag_begin(Ranks p, unsigned long long call) {
  Flags* mine = p.flags[p.rank];
  for (int r = 0; r < p.n; ++r)
    if (r != p.rank) atomicMax(&p.flags[r]->begun[p.rank], call);
  if (*static_cast<volatile unsigned long long*>(&mine->timed_out) != 0) return;
  for (int r = 0; r < p.n; ++r)
    if (r != p.rank && !wait_at_least(&mine->begun[r], call)) {
      atomicCAS(&mine->timed_out, 0ull, call);
      return;
    }
}

__global__ void flag_end(Ranks p, unsigned long long call) {
  Flags* mine = p.flags[p.rank];
  __threadfence();
  for (int r = 0; r < p.n; ++r)
    if (r != p.rank) atomicAdd(&p.flags[r]->ended, 1ull);
  if (*static_cast<volatile unsigned long long*>(&mine->timed_out) == 0 && !wait_at_least(&mine->ended, call * (p.n - 1)))
    atomicCAS(&mine->timed_out, 0ull, call);
}

// The kernel bodies tried, each with and without the flags.
using Kernel = void (*)(Ranks, unsigned long long);
struct Variant {
  const char* name;
  Kernel plain, flagged;
};
template <int kUnroll, bool kStreaming>
constexpr Variant variant(const char* name) {
  return {name, share_reduce<false, kUnroll, kStreaming>, share_reduce<true, kUnroll, kStreaming>};
}
const Variant kVariants[] = {variant<1, false>("x1 plain"), variant<1, true>("x1 ld/st.cs"),
                             variant<2, true>("x2 ld/st.cs"), variant<4, true>("x4 ld/st.cs"),
                             variant<4, false>("x4 plain")};
constexpr int kNVariants = sizeof kVariants / sizeof kVariants[0];

__host__ __device__ float value(std::size_t element, int rank) {
  return static_cast<float>((element * 7 + rank * 13) % 1024);
}

// What every output holds: the inputs' sum in rank order (exact: small integers).
__host__ __device__ float expected(std::size_t element, int n) {
  float sum = value(element, 0);
  for (int r = 1; r < n; ++r) sum += value(element, r);
  return sum;
}

__global__ void fill(float4* x, int rank) {
  for (std::size_t q = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; q < kPacks;
       q += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t e = 4 * q;
    x[q] = float4{value(e, rank), value(e + 1, rank), value(e + 2, rank), value(e + 3, rank)};
  }
}

__global__ void count_wrong(const float4* x, int n, unsigned long long* wrong) {
  for (std::size_t q = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; q < kPacks;
       q += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t e = 4 * q;
    const float4 v = x[q];
    if (v.x != expected(e, n) || v.y != expected(e + 1, n) || v.z != expected(e + 2, n) || v.w != expected(e + 3, n))
      atomicAdd(wrong, 1ull);
  }
}

// Between the processes of one run, in shared memory mapped before the fork.
struct Shared {
  int n;
  cudaIpcMemHandle_t in[kMaxRanks], out[kMaxRanks], flags[kMaxRanks];
  cudaIpcEventHandle_t ready[kMaxRanks], done[kMaxRanks];
  std::atomic<unsigned long long> arrived;
  // Events mode: the last call whose event each rank has recorded.
  std::atomic<unsigned long long> issued_ready[kMaxRanks], issued_done[kMaxRanks];
  // Way kFlagHosts: the last call each rank's host has reached.
  std::atomic<unsigned long long> reached[kMaxRanks];
  double ms[kNVariants][kWays][kMaxRanks];                // [variant][way][rank]: the timed calls
  unsigned long long wrong[kNVariants][kWays][kMaxRanks];  // [variant][way][rank]: packs wrong after the checked call
  double copy_ms;
  // By variant: the kernel alone on every pack, one pack a thread (as
  // reduce_multi) and on the resident grid; the resident blocks; the grid of each rank's kernel.
  double alone_ms[kNVariants], alone_resident_ms[kNVariants];
  int grid[kNVariants], resident[kNVariants];
};

bool ok(cudaError_t e, int rank, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("allreduce_wait: rank %d: %s: %s\n", rank, what, cudaGetErrorString(e));
  return false;
}

// Waits for `*counter >= target`, at most 10 s (another process may have failed).
bool wait_for(const std::atomic<unsigned long long>& counter, unsigned long long target, int rank, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (counter.load() < target) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::printf("allreduce_wait: rank %d: another process never reached %s\n", rank, what);
      return false;
    }
    std::this_thread::yield();
  }
  return true;
}

int run(int rank, Shared* s) {
  const int n = s->n;
  unsigned long long barriers = 0;
  auto barrier = [&](const char* what) {
    s->arrived.fetch_add(1);
    return wait_for(s->arrived, n * ++barriers, rank, what);
  };
  float4 *in = nullptr, *out = nullptr;
  Flags* flags = nullptr;
  unsigned long long* wrong = nullptr;
  cudaStream_t stream, worker;
  cudaEvent_t ready, done, peer_ready[kMaxRanks], peer_done[kMaxRanks], to_worker, from_worker, staged, finished;
  const unsigned ev_flags = cudaEventDisableTiming | cudaEventInterprocess;
  if (!ok(cudaMalloc(&in, kBytes), rank, "cudaMalloc") || !ok(cudaMalloc(&out, kBytes), rank, "cudaMalloc") ||
      !ok(cudaMalloc(&flags, sizeof(Flags)), rank, "cudaMalloc") ||
      !ok(cudaMalloc(&wrong, sizeof(unsigned long long)), rank, "cudaMalloc") ||
      !ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), rank, "cudaStreamCreate") ||
      !ok(cudaStreamCreateWithFlags(&worker, cudaStreamNonBlocking), rank, "cudaStreamCreate") ||
      !ok(cudaEventCreateWithFlags(&to_worker, cudaEventDisableTiming), rank, "cudaEventCreate") ||
      !ok(cudaEventCreateWithFlags(&from_worker, cudaEventDisableTiming), rank, "cudaEventCreate") ||
      !ok(cudaEventCreateWithFlags(&staged, cudaEventDisableTiming), rank, "cudaEventCreate") ||
      !ok(cudaEventCreateWithFlags(&finished, cudaEventDisableTiming), rank, "cudaEventCreate") ||
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
  Ranks all{};
  all.n = n;
  all.rank = rank;
  for (int r = 0; r < n; ++r) {
    if (r == rank) {
      all.in[r] = in;
      all.out[r] = out;
      all.flags[r] = flags;
      continue;
    }
    void *their_in = nullptr, *their_out = nullptr, *their_flags = nullptr;
    const unsigned lazy = cudaIpcMemLazyEnablePeerAccess;
    if (!ok(cudaIpcOpenMemHandle(&their_in, s->in[r], lazy), rank, "cudaIpcOpenMemHandle") ||
        !ok(cudaIpcOpenMemHandle(&their_out, s->out[r], lazy), rank, "cudaIpcOpenMemHandle") ||
        !ok(cudaIpcOpenMemHandle(&their_flags, s->flags[r], lazy), rank, "cudaIpcOpenMemHandle") ||
        !ok(cudaIpcOpenEventHandle(&peer_ready[r], s->ready[r]), rank, "cudaIpcOpenEventHandle") ||
        !ok(cudaIpcOpenEventHandle(&peer_done[r], s->done[r]), rank, "cudaIpcOpenEventHandle"))
      return 1;
    all.in[r] = static_cast<const float4*>(their_in);
    all.out[r] = static_cast<float4*>(their_out);
    all.flags[r] = static_cast<Flags*>(their_flags);
  }
  Ranks share = all;
  share.begin = rank * (kPacks / n);
  share.end = rank == n - 1 ? kPacks : share.begin + kPacks / n;
  all.begin = 0;
  all.end = kPacks;

  if (rank == 0) {  // the copy and the kernels alone, while the others wait
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    s->copy_ms = best_ms(stream, 6, [&] { cudaMemcpyAsync(out, in, kBytes, cudaMemcpyDeviceToDevice, stream); });
    for (int v = 0; v < kNVariants; ++v) {
      int per_sm = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kVariants[v].flagged, kThreads, 0);
      s->resident[v] = per_sm * sms;
      s->grid[v] = std::max(1, s->resident[v] / n);
      const Kernel alone = kVariants[v].plain;
      const int every_pack = static_cast<int>(std::min<std::size_t>(kPacks / kThreads, 65535));
      s->alone_ms[v] = best_ms(stream, 6, [&] { alone<<<every_pack, kThreads, 0, stream>>>(all, 0); });
      s->alone_resident_ms[v] = best_ms(stream, 6, [&] { alone<<<s->resident[v], kThreads, 0, stream>>>(all, 0); });
    }
    if (!ok(cudaStreamSynchronize(stream), rank, "the copy and the kernels alone")) return 1;
  }
  if (!barrier("the copy")) return 1;
  unsigned long long host_calls = 0;  // kFlagHosts, on across the variants as s->reached

  for (int v = 0; v < kNVariants; ++v) {
    const Variant& kernel = kVariants[v];
    const int grid = s->grid[v];
    // The flags count calls and blocks from 0 again for each variant (its
    // grid may differ): every process is idle between these barriers.
    cudaMemsetAsync(flags, 0, sizeof(Flags), stream);
    if (!ok(cudaStreamSynchronize(stream), rank, "clearing the flags") || !barrier("the cleared flags")) return 1;
    unsigned long long events_call = 0, flags_call = 0, kernels_call = 0;
    const int every_pack = static_cast<int>(std::min<std::size_t>((share.end - share.begin) / kThreads, 65535));
    // Queues one call; false when another process never queued its part.
    // Both flags ways count their calls on: the flags hold every call's.
    auto call = [&](Way way) {
      if (way == kFlags) {
        kernel.flagged<<<grid, kThreads, 0, stream>>>(share, ++flags_call);
        return true;
      }
      if (way == kFlagKernels || way == kFlagRecords || way == kFlagHosts) {
        if (way == kFlagHosts) {
          s->reached[rank].store(++host_calls);
          for (int r = 0; r < n; ++r)
            if (r != rank && !wait_for(s->reached[r], host_calls, rank, "a call on its host")) return false;
        }
        if (way != kFlagKernels) cudaEventRecord(staged, stream);
        flag_begin<<<1, 1, 0, stream>>>(share, ++kernels_call);
        kernel.plain<<<every_pack, kThreads, 0, stream>>>(share, 0);
        flag_end<<<1, 1, 0, stream>>>(share, kernels_call);
        if (way != kFlagKernels) cudaEventRecord(finished, stream);
        return true;
      }
      if (way == kFlagsWorker) {
        cudaEventRecord(to_worker, stream);
        cudaStreamWaitEvent(worker, to_worker, 0);
        kernel.flagged<<<grid, kThreads, 0, worker>>>(share, ++flags_call);
        cudaEventRecord(from_worker, worker);
        cudaStreamWaitEvent(stream, from_worker, 0);
        return true;
      }
      // A rank records its events of call k + 1 only once every rank has
      // queued its waits for those of call k (so each wait sees call k's).
      // The hosts' counters of issued events go on across the variants.
      const unsigned long long k = v * 2 * (kWarmup + kCalls + 1) + ++events_call;
      // Records `own`, then has the stream wait for every other rank's event of call k.
      auto exchange = [&](cudaEvent_t own, std::atomic<unsigned long long>* issued, cudaEvent_t* theirs,
                          const char* what) {
        cudaEventRecord(own, stream);
        issued[rank].store(k);
        for (int r = 0; r < n; ++r) {
          if (r == rank) continue;
          if (!wait_for(issued[r], k, rank, what)) return false;
          cudaStreamWaitEvent(stream, theirs[r], 0);
        }
        return true;
      };
      if (!exchange(ready, s->issued_ready, peer_ready, "its ready event")) return false;
      kernel.plain<<<way == kEventsFull ? every_pack : grid, kThreads, 0, stream>>>(share, 0);
      return exchange(done, s->issued_done, peer_done, "its done event");
    };
    for (const Way way : {kEvents, kFlags, kFlagsWorker, kEventsFull, kFlagKernels, kFlagRecords, kFlagHosts}) {
      const char* name = kWayNames[way];
      // One checked call: the outputs cleared (NaN) in every process first.
      cudaMemsetAsync(out, 0xff, kBytes, stream);
      cudaMemsetAsync(wrong, 0, sizeof(unsigned long long), stream);
      if (!ok(cudaStreamSynchronize(stream), rank, "clearing") || !barrier("the cleared outputs")) return 1;
      if (!call(way)) return 1;
      count_wrong<<<1024, kThreads, 0, stream>>>(out, n, wrong);
      unsigned long long n_wrong = 0;
      cudaMemcpyAsync(&n_wrong, wrong, sizeof n_wrong, cudaMemcpyDeviceToHost, stream);
      if (!ok(cudaStreamSynchronize(stream), rank, name)) return 1;
      s->wrong[v][way][rank] = n_wrong;
      for (int i = 0; i < kWarmup; ++i)
        if (!call(way)) return 1;
      if (!ok(cudaStreamSynchronize(stream), rank, name) || !barrier("the warm-up")) return 1;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kCalls; ++i)
        if (!call(way)) return 1;
      if (!ok(cudaStreamSynchronize(stream), rank, name)) return 1;
      s->ms[v][way][rank] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      Flags f{};
      cudaMemcpy(&f, flags, sizeof f, cudaMemcpyDeviceToHost);
      if (f.timed_out != 0) {
        std::printf("allreduce_wait: rank %d: %s, %s: call %llu waited 2 s for another process's kernel and gave up\n",
                    rank, kernel.name, name, f.timed_out);
        return 1;
      }
      if (!barrier("the timed calls")) return 1;
    }
  }
  for (int r = 0; r < n; ++r) {
    if (r == rank) continue;
    cudaIpcCloseMemHandle(const_cast<float4*>(all.in[r]));
    cudaIpcCloseMemHandle(all.out[r]);
    cudaIpcCloseMemHandle(all.flags[r]);
  }
  return 0;
}

// One all_reduce of n ranks in processes of their own, forked before this
// process touches CUDA (it never does), at most 60 s; prints one line.
bool probe(int n) {
  auto* s = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (s == MAP_FAILED) return false;
  std::memset(static_cast<void*>(s), 0, sizeof(Shared));
  s->n = n;
  std::fflush(stdout);
  pid_t pids[kMaxRanks];
  int forked = 0;
  for (; forked < n; ++forked) {
    pids[forked] = fork();
    if (pids[forked] < 0) break;
    if (pids[forked] == 0) {
      const int r = run(forked, s);
      std::fflush(stdout);
      _exit(r);
    }
  }
  bool failed = forked < n;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);  // for every rank at once
  for (int r = 0; r < forked; ++r) {
    bool killed = false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    failed = !reap_within(pids[r], std::max(left, std::chrono::milliseconds(0)), &killed) || failed;
    if (killed) std::printf("allreduce_wait: %d ranks: rank %d gave no answer within 60 s\n", n, r);
  }
  if (!failed) {
    // Each way's busbw (bytes / time a call x 2 (n - 1) / n) over the copy's
    // (bytes / time); the traffic's bound is 2 (n - 1) / n^2 of the copy.
    const double factor = 2.0 * (n - 1) / n, copy_us = 1000 * s->copy_ms;
    auto ratio = [&](double us) { return factor * copy_us / us; };
    std::printf("allreduce_wait: %d ranks, 256 MiB f32, %d calls: copy %.1f us (%.0f GB/s); busbw over the copy's, "
                "bound %.3f\n", n, kCalls, copy_us, kBytes / (copy_us * 1e3), factor / n);
    for (int v = 0; v < kNVariants; ++v) {
      const double alone_us = 1000 * s->alone_ms[v], resident_us = 1000 * s->alone_resident_ms[v];
      std::printf("allreduce_wait: %d ranks, %s, %d blocks a kernel (1/%d of %d resident): alone %.1f us (%.3f), "
                  "alone on the resident grid %.1f us (%.3f)", n, kVariants[v].name, s->grid[v], n, s->resident[v],
                  alone_us, ratio(alone_us), resident_us, ratio(resident_us));
      for (int way = 0; way < kWays; ++way) {
        const double us = 1000 * *std::max_element(s->ms[v][way], s->ms[v][way] + n) / kCalls;
        std::printf(", %s %.1f us (%.3f)", kWayNames[way], us, ratio(us));
      }
      std::printf("\n");
      for (int way = 0; way < kWays; ++way)
        for (int r = 0; r < n; ++r)
          if (s->wrong[v][way][r] != 0) {
            std::printf("allreduce_wait: %d ranks: WRONG: %s, %s: %llu packs of rank %d's output\n", n,
                        kVariants[v].name, kWayNames[way], s->wrong[v][way][r], r);
            failed = true;
          }
    }
  }
  munmap(s, sizeof(Shared));
  return !failed;
}

}  // namespace

int main(int argc, char** argv) {
  bool right = true;
  const int defaults[] = {2, 4};
  const int runs = argc > 1 ? argc - 1 : 2;
  for (int i = 0; i < runs; ++i) {
    const int n = argc > 1 ? std::atoi(argv[i + 1]) : defaults[i];
    if (n < 2 || n > kMaxRanks) {
      std::printf("allreduce_wait: ranks must be 2..%d, not %s\n", kMaxRanks, argv[i + 1]);
      return 2;
    }
    right = probe(n) && right;
  }
  return right ? 0 : 1;
}
