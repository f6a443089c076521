// What a stream held at a gate (comm/device_gate.cu) does to other work on
// the GPU (issue 19: ranks sharing one GPU hung in their first collective).
// Each mode runs in a fresh process; prints one line per mode.
//   spin:  process A holds a stream with a kernel polling mapped host
//          memory (the gate); process B times one tiny kernel meanwhile;
//   wait:  the same with A's stream held by cuStreamWaitValue64 instead;
//   lazy:  one process holds a stream with the gate, then launches a kernel
//          for the first time on another stream (lazy loading may
//          synchronize the context: the gate's 2 s timeout ends the wait);
//   loaded: the same with that kernel launched once before the gate;
//   ipc:   process A holds a stream at the gate, then opens process B's
//          buffer (cudaIpcOpenMemHandle): does the open wait for the gate?
//   thread: one thread waits in cudaDeviceSynchronize (which waits for the
//          gate, as a trainer reading its loss would) while another, the
//          engine's part, launches a loaded kernel and waits for it: does a
//          thread blocked in a synchronizing call hold the others up?
//   pingpong, spinpong, hostpong: two processes take turns on the GPU, each
//          turn a tiny kernel, and the mean time of a round (two turns, so
//          two switches between the processes' contexts) is printed: the
//          least a collective of ranks sharing a GPU can cost. pingpong
//          waits and signals in the GPU's front end (cuStreamWaitValue64,
//          cuStreamWriteValue64 on shared host memory), no host in the
//          loop; spinpong waits in a polling kernel (as the gate kernel
//          does) and signals from a kernel; hostpong has each host thread
//          wait for its turn, launch, poll its event and hand the turn on
//          (as an engine does, with no stream held meanwhile).
//   wake:  how soon a host thread learns that a kernel of 0 or 250 us (a
//          256 MiB all_reduce's) is done: by polling its event with
//          sleeps doubling 5..100 us at the default timer slack (as
//          wait_for_event did), with comm/poll_pause.h's pause (as
//          wait_for_event does), by a host function that wakes it
//          (StreamWake), or by spinning on the event; the mean time per
//          kernel, each way.
//   eventpong: two processes take turns of a 50 us kernel, each turn's
//          stream waiting for the other's interprocess event (as the event
//          gate's streams do); the time per turn beyond the kernel.
//   reduce: the kernel of a 2-rank 256 MiB all_reduce alone, beside a
//          256 MiB device-to-device copy (the bound of issue 19's target).
// Built by scripts/gpu_kit.sh: nvcc -std=c++20 -I. -Iinclude -o cuda_gate_probe
// scripts/cuda_gate_probe.cu kernels/cuda/reduce.cu
#include <cuda.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "comm/poll_pause.h"
#include "kernels/cuda/reduce.h"
#include "scripts/cuda_timing.h"
#include "scripts/probe_child.h"

namespace {

__global__ void spin(const volatile unsigned long long* gate, unsigned long long timeout_ns) {
  const unsigned long long start = globaltimer_ns();
  while (*gate == 0 && globaltimer_ns() - start < timeout_ns) __nanosleep(1000);
}

__global__ void tiny(int* p) { *p = 1; }

__global__ void spin_until(const volatile unsigned long long* counter, unsigned long long target,
                           unsigned long long timeout_ns) {
  const unsigned long long start = globaltimer_ns();
  while (*counter < target && globaltimer_ns() - start < timeout_ns) __nanosleep(200);
}

__global__ void signal_value(volatile unsigned long long* counter, unsigned long long value) {
  __threadfence_system();
  *counter = value;
}
__global__ void first_time(int* p) { *p = 2; }
__global__ void second_kernel(int* p) { *p = 3; }

struct Shared {
  std::atomic<int> child_ready, gated, child_done;
  double child_ms;
  cudaIpcMemHandle_t handle;  // ipc mode: B's buffer
};

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

using WaitValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

int probe(const char* mode) {
  auto* s = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::memset(static_cast<void*>(s), 0, sizeof(Shared));
  const pid_t pid = fork();
  if (pid == 0) {  // B
    int* d = nullptr;
    if (!ok(cudaMalloc(&d, sizeof(int)), "B cudaMalloc")) _exit(1);
    cudaEvent_t done;
    cudaEventCreate(&done);
    s->child_ready = 1;
    for (int i = 0; !s->gated && i < 10000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // A's gate is resident by now
    const auto t0 = std::chrono::steady_clock::now();
    tiny<<<1, 1>>>(d);
    cudaEventRecord(done);
    double ms = -1;
    for (;;) {
      const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (cudaEventQuery(done) == cudaSuccess) { ms = t; break; }
      if (t > 3000) break;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    s->child_ms = ms;
    s->child_done = 1;
    cudaDeviceSynchronize();
    _exit(0);
  }
  // A
  unsigned long long* gate = nullptr;
  unsigned long long* gate_dev = nullptr;
  if (!ok(cudaHostAlloc(reinterpret_cast<void**>(&gate), 8, cudaHostAllocMapped), "A cudaHostAlloc")) return 1;
  *gate = 0;
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&gate_dev), gate, 0);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (int i = 0; !s->child_ready && i < 10000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!s->child_ready) {
    std::printf("%s: the other process did not start CUDA\n", mode);
    waitpid(pid, nullptr, 0);
    return 1;
  }
  if (std::strcmp(mode, "spin") == 0) {
    spin<<<1, 1, 0, stream>>>(gate_dev, 5'000'000'000ull);
  } else {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (!ok(cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &fn, 12000, cudaEnableDefault, &found),
            "cudaGetDriverEntryPointByVersion") || found != cudaDriverEntryPointSuccess || !fn) {
      std::printf("wait: cuStreamWaitValue64 not found\n");
      return 1;
    }
    const CUresult r = reinterpret_cast<WaitValue64>(fn)(stream, reinterpret_cast<CUdeviceptr>(gate_dev), 1,
                                                         CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) std::printf("wait: cuStreamWaitValue64 returned %d\n", static_cast<int>(r));
  }
  s->gated = 1;
  const auto t0 = std::chrono::steady_clock::now();
  while (!s->child_done &&
         std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(4000))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::atomic_ref<unsigned long long>(*gate).store(1);
  cudaStreamSynchronize(stream);
  int status = 0;
  waitpid(pid, &status, 0);
  if (s->child_ms < 0)
    std::printf("%s: the other process's kernel did not run within 3000 ms while this one's stream was held\n", mode);
  else
    std::printf("%s: the other process's kernel ran in %.3f ms while this one's stream was held\n", mode, s->child_ms);
  return 0;
}

// One process's gate (2 s timeout) on `held`, and `other`, a second stream
// with a kernel of its own to time.
struct OneProcess {
  unsigned long long* gate = nullptr;  // host view
  unsigned long long* gate_dev = nullptr;
  int* d = nullptr;
  cudaStream_t held = nullptr, other = nullptr;
  cudaEvent_t done = nullptr;

  bool init() {
    if (!ok(cudaHostAlloc(reinterpret_cast<void**>(&gate), 8, cudaHostAllocMapped), "cudaHostAlloc")) return false;
    if (!ok(cudaMalloc(&d, sizeof(int)), "cudaMalloc")) return false;
    *gate = 0;
    cudaHostGetDevicePointer(reinterpret_cast<void**>(&gate_dev), gate, 0);
    cudaStreamCreateWithFlags(&held, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    return true;
  }
  void load_second_kernel() {
    second_kernel<<<1, 1, 0, other>>>(d);
    cudaStreamSynchronize(other);
  }
  void hold() { spin<<<1, 1, 0, held>>>(gate_dev, 2'000'000'000ull); }
  void open() { std::atomic_ref<unsigned long long>(*gate).store(1); }

  // Launches a kernel on `other` and waits for it: milliseconds until the
  // launch returned and until the kernel was done.
  std::pair<double, double> time_kernel(bool first) {
    const auto t0 = std::chrono::steady_clock::now();
    auto since = [&] {
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    if (first) first_time<<<1, 1, 0, other>>>(d);
    else second_kernel<<<1, 1, 0, other>>>(d);
    const double launch_ms = since();
    cudaEventRecord(done, other);
    while (cudaEventQuery(done) == cudaErrorNotReady) std::this_thread::sleep_for(std::chrono::microseconds(50));
    return {launch_ms, since()};
  }
};

// The gate on one stream, then a kernel on another; how long until that
// kernel is done (the gate gives up after 2 s by itself).
int lazy(const char* mode, bool loaded) {
  OneProcess p;
  if (!p.init()) return 1;
  if (loaded) p.load_second_kernel();
  p.hold();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto [launch_ms, ms] = p.time_kernel(!loaded);
  p.open();
  cudaDeviceSynchronize();
  std::printf("%s: a kernel on another stream, while one stream was held at the gate: launch returned in %.3f ms, "
              "done in %.3f ms%s\n",
              mode, launch_ms, ms, ms > 1500 ? " (only once the gate gave up)" : "");
  return 0;
}

// The main thread holds a stream at the gate and waits in
// cudaDeviceSynchronize; a second thread launches a kernel loaded before,
// waits for it and then opens the gate (the gate gives up after 2 s).
int threaded(const char* mode) {
  OneProcess p;
  if (!p.init()) return 1;
  p.load_second_kernel();
  p.hold();
  std::pair<double, double> engine_ms{-1, -1};
  std::thread engine([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the main thread is inside the sync by now
    engine_ms = p.time_kernel(false);
    p.open();
  });
  const auto t0 = std::chrono::steady_clock::now();
  const cudaError_t status = cudaDeviceSynchronize();
  const double sync_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  engine.join();
  const auto [launch_ms, done_ms] = engine_ms;
  std::printf("%s: a loaded kernel launched by one thread while another waited in cudaDeviceSynchronize for the "
              "gate: launch returned in %.3f ms, done in %.3f ms; the sync: %s in %.3f ms%s\n",
              mode, launch_ms, done_ms, cudaGetErrorString(status), sync_ms,
              done_ms > 1500 ? " (only once the gate gave up)" : "");
  return 0;
}

// Process B exports a buffer; process A, with a stream held at the gate
// (2 s timeout), opens it and times the open.
int ipc(const char* mode) {
  auto* s = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::memset(static_cast<void*>(s), 0, sizeof(Shared));
  const pid_t pid = fork();
  if (pid == 0) {
    void* d = nullptr;
    if (!ok(cudaMalloc(&d, 1 << 20), "B cudaMalloc") || !ok(cudaIpcGetMemHandle(&s->handle, d), "B handle"))
      _exit(1);
    s->child_ready = 1;
    for (int i = 0; !s->child_done && i < 10000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    _exit(0);
  }
  for (int i = 0; !s->child_ready && i < 10000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  unsigned long long* gate = nullptr;
  unsigned long long* gate_dev = nullptr;
  if (!s->child_ready || !ok(cudaHostAlloc(reinterpret_cast<void**>(&gate), 8, cudaHostAllocMapped), "cudaHostAlloc")) {
    s->child_done = 1;
    waitpid(pid, nullptr, 0);
    return 1;
  }
  *gate = 0;
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&gate_dev), gate, 0);
  cudaStream_t held;
  cudaStreamCreateWithFlags(&held, cudaStreamNonBlocking);
  spin<<<1, 1, 0, held>>>(gate_dev, 2'000'000'000ull);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  void* peer = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  const cudaError_t status = cudaIpcOpenMemHandle(&peer, s->handle, cudaIpcMemLazyEnablePeerAccess);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::atomic_ref<unsigned long long>(*gate).store(1);
  cudaDeviceSynchronize();
  std::printf("%s: cudaIpcOpenMemHandle while a stream was held at the gate: %s in %.3f ms%s\n", mode,
              cudaGetErrorString(status), ms, ms > 1500 ? " (only once the gate gave up)" : "");
  if (status == cudaSuccess) cudaIpcCloseMemHandle(peer);
  s->child_done = 1;
  waitpid(pid, nullptr, 0);
  return 0;
}

}  // namespace

using WriteValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

template <typename F>
F driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<F>(fn);
}

// Two processes, A and B, take turns: A's turn i waits for counter a >= i,
// B's for b >= i; each runs `tiny` and hands the turn on (A sets b = i, B
// sets a = i + 1). The counters lie in shared memory both register with CUDA.
int pong(const char* mode) {
  struct Turns {
    volatile unsigned long long a, b;
    std::atomic<int> ready;
    double ms;
  };
  const bool spin = std::strcmp(mode, "spinpong") == 0, host = std::strcmp(mode, "hostpong") == 0;
  const int rounds = spin ? 100 : 2000;
  auto* t = static_cast<Turns*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::memset(static_cast<void*>(t), 0, 4096);
  t->a = 1;
  const pid_t pid = fork();
  const bool is_a = pid != 0;
  auto fail = [&](const char* what) {
    std::printf("%s: %s failed\n", mode, what);
    if (is_a) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
    else _exit(1);
    return 1;
  };
  if (!ok(cudaHostRegister(t, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable), "cudaHostRegister"))
    return fail("cudaHostRegister");
  Turns* td = nullptr;
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&td), t, 0);
  auto* mine = is_a ? &td->a : &td->b;
  auto* theirs = is_a ? &td->b : &td->a;
  int* d = nullptr;
  cudaMalloc(&d, sizeof(int));
  unsigned long long* scratch = nullptr;
  cudaMalloc(&scratch, sizeof(unsigned long long));
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEvent_t done;
  cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  auto wait_value = driver_entry<WaitValue64>("cuStreamWaitValue64");
  auto write_value = driver_entry<WriteValue64>("cuStreamWriteValue64");
  if (!wait_value || !write_value) return fail("looking up cuStreamWaitValue64 / cuStreamWriteValue64");
  // Every kernel once before timing (and both processes' contexts up).
  tiny<<<1, 1, 0, stream>>>(d);
  spin_until<<<1, 1, 0, stream>>>(&td->a, 0, 0);
  signal_value<<<1, 1, 0, stream>>>(scratch, 0);
  cudaStreamSynchronize(stream);
  t->ready.fetch_add(1);
  while (t->ready.load() < 2) std::this_thread::sleep_for(std::chrono::microseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  for (unsigned long long i = 1; i <= static_cast<unsigned long long>(rounds); ++i) {
    const unsigned long long next = is_a ? i : i + 1;
    if (host) {
      const volatile unsigned long long* my_counter = is_a ? &t->a : &t->b;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (*my_counter < i) {
        if (std::chrono::steady_clock::now() > deadline) return fail("waiting for the turn");
        std::this_thread::sleep_for(std::chrono::microseconds(5));
      }
      tiny<<<1, 1, 0, stream>>>(d);
      cudaEventRecord(done, stream);
      while (cudaEventQuery(done) == cudaErrorNotReady) std::this_thread::sleep_for(std::chrono::microseconds(5));
      std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(is_a ? &t->b : &t->a)).store(next);
    } else if (spin) {
      spin_until<<<1, 1, 0, stream>>>(mine, i, 5'000'000'000ull);
      tiny<<<1, 1, 0, stream>>>(d);
      signal_value<<<1, 1, 0, stream>>>(const_cast<unsigned long long*>(theirs), next);
    } else {
      wait_value(stream, reinterpret_cast<CUdeviceptr>(const_cast<unsigned long long*>(mine)), i,
                 CU_STREAM_WAIT_VALUE_GEQ);
      tiny<<<1, 1, 0, stream>>>(d);
      write_value(stream, reinterpret_cast<CUdeviceptr>(const_cast<unsigned long long*>(theirs)), next, 0);
    }
  }
  const cudaError_t synced = cudaStreamSynchronize(stream);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!is_a) {
    _exit(synced == cudaSuccess ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (synced != cudaSuccess || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return fail("the rounds");
  std::printf("%s: %d rounds of two turns in %.1f ms: %.1f us a round\n", mode, rounds, ms, 1000 * ms / rounds);
  return 0;
}

__global__ void busy(unsigned long long ns) {
  const unsigned long long start = globaltimer_ns();
  while (globaltimer_ns() - start < ns) {
  }
}

struct Woken {
  std::mutex mu;
  std::condition_variable cv;
  bool fired = false;
};

void CUDART_CB wake_up(void* data) {
  auto* w = static_cast<Woken*>(data);
  {
    std::lock_guard lock(w->mu);
    w->fired = true;
  }
  w->cv.notify_all();
}

int wake(const char* mode) {
  cudaStream_t stream;
  cudaEvent_t done;
  if (!ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !ok(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate"))
    return 1;
  const int rounds = 400;
  for (const unsigned long long ns : {0ull, 250'000ull}) {
    std::printf("%s: kernel of %llu us:", mode, ns / 1000);
    for (const char* how : {"sleep-poll", "fine poll", "host function", "spin"}) {
      Woken w;
      busy<<<1, 1, 0, stream>>>(0);  // loaded, and the callback thread started
      cudaLaunchHostFunc(stream, wake_up, &w);
      cudaStreamSynchronize(stream);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < rounds; ++i) {
        w.fired = false;
        busy<<<1, 1, 0, stream>>>(ns);
        cudaEventRecord(done, stream);
        if (how[0] == 'h') {
          cudaLaunchHostFunc(stream, wake_up, &w);
          std::unique_lock lock(w.mu);
          w.cv.wait(lock, [&] { return w.fired; });
        } else if (how[0] == 's' && how[1] == 'l') {
          auto pause = std::chrono::microseconds(5);
          while (cudaEventQuery(done) == cudaErrorNotReady) {
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, std::chrono::microseconds(100));
          }
        } else if (how[0] == 'f') {
          braid::comm::PollPause pause;
          while (cudaEventQuery(done) == cudaErrorNotReady) pause();
        } else {
          while (cudaEventQuery(done) == cudaErrorNotReady) {
          }
        }
      }
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (!ok(cudaStreamSynchronize(stream), "the rounds")) return 1;
      std::printf(" %s %.1f us", how, us / rounds);
    }
    std::printf("\n");
  }
  return 0;
}

// Two processes take turns as the event gate's streams do (comm/device.h):
// each turn, the stream waits for the other process's interprocess event,
// runs a 50 us kernel and records its own event; the hosts only hand each
// other the order of the calls (a counter in shared memory), so they run
// ahead of the GPU. Prints the time per turn beyond the kernel: what one
// wait for another process's event costs, with or without MPS.
int event_pong(const char* mode) {
  struct Turns {
    std::atomic<unsigned long long> issued[2];  // the last turn each host queued
    cudaIpcEventHandle_t handle[2];
    std::atomic<int> ready;
  };
  const int rounds = 400;
  const unsigned long long kernel_ns = 50'000;
  auto* t = static_cast<Turns*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::memset(static_cast<void*>(t), 0, 4096);
  const pid_t pid = fork();
  const int me = pid != 0 ? 0 : 1, peer = 1 - me;
  auto fail = [&](const char* what) {
    std::printf("%s: %s failed\n", mode, what);
    if (me == 0) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
    else _exit(1);
    return 1;
  };
  cudaStream_t stream;
  cudaEvent_t own, theirs;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (!ok(cudaEventCreateWithFlags(&own, cudaEventDisableTiming | cudaEventInterprocess), "cudaEventCreate") ||
      !ok(cudaIpcGetEventHandle(&t->handle[me], own), "cudaIpcGetEventHandle"))
    return fail("the interprocess event");
  busy<<<1, 1, 0, stream>>>(0);
  cudaStreamSynchronize(stream);
  t->ready.fetch_add(1);
  while (t->ready.load() < 2) std::this_thread::sleep_for(std::chrono::microseconds(100));
  if (!ok(cudaIpcOpenEventHandle(&theirs, t->handle[peer]), "cudaIpcOpenEventHandle")) return fail("opening");
  const auto t0 = std::chrono::steady_clock::now();
  // Turn i of process 0 follows turn i - 1 of process 1; turn i of process
  // 1 follows turn i of process 0. A host queues a turn once the other has
  // queued the turn before it (so the event it waits for is recorded, and
  // its own event's last record is waited for).
  for (unsigned long long i = 1; i <= static_cast<unsigned long long>(rounds); ++i) {
    const unsigned long long before = me == 0 ? i - 1 : i;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (t->issued[peer].load() < before)
      if (std::chrono::steady_clock::now() > deadline) return fail("waiting for the turn");
    if (before > 0) cudaStreamWaitEvent(stream, theirs, 0);
    busy<<<1, 1, 0, stream>>>(kernel_ns);
    cudaEventRecord(own, stream);
    t->issued[me].store(i);
  }
  const cudaError_t synced = cudaStreamSynchronize(stream);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (me == 1) _exit(synced == cudaSuccess ? 0 : 1);
  int status = 0;
  waitpid(pid, &status, 0);
  if (synced != cudaSuccess || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return fail("the rounds");
  const double turn_us = 1000 * ms / (2 * rounds);
  std::printf("%s: %d rounds of two 50 us turns in %.1f ms: %.1f us a turn, %.1f beyond the kernel\n", mode,
              rounds, ms, turn_us, turn_us - kernel_ns / 1000.0);
  return 0;
}

// One pack of 4 floats per thread, both sources then both destinations:
// reduce_multi's loop (kernels/cuda/reduce.cu) with the sources' and
// destinations' count known when compiled. (On the H200 a reduce_multi
// that loaded 4 packs a thread before using them, streaming, ran at 0.499,
// this at 0.512.)
__global__ void plain_reduce2(const float4* a, const float4* b, float4* x, float4* y, std::size_t packs) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t q = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; q < packs; q += stride) {
    float4 u = a[q], v = b[q];
    float4 r{u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w};
    x[q] = r;
    y[q] = r;
  }
}

// The kernel of a 2-rank 256 MiB all_reduce alone: two f32 inputs reduced
// into two outputs (each byte read once, written once), as one kernel and as
// the two halves one worker runs, beside a 256 MiB cudaMemcpy; each as the
// busbw it would give an all_reduce (bytes / time) over the copy's bandwidth
// (bytes / time): 0.5 is the traffic's bound.
int reduce_alone(const char* mode) {
  const std::size_t bytes = 256u << 20, count = bytes / 4;
  void* buf[4];
  for (auto& b : buf)
    if (!ok(cudaMalloc(&b, bytes), "cudaMalloc")) return 1;
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  auto best_ms = [&](auto&& body) { return ::best_ms(stream, 6, body); };
  const float copy = best_ms([&] { cudaMemcpyAsync(buf[2], buf[0], bytes, cudaMemcpyDeviceToDevice, stream); });
  const void* srcs[2] = {buf[0], buf[1]};
  void* dsts[2] = {buf[2], buf[3]};
  using braid::DataType;
  using braid::ReduceOp;
  const float one = best_ms([&] {
    braid::kernels::cuda::reduce_multi(dsts, 2, srcs, 2, count, DataType::f32, ReduceOp::sum, 0, stream);
  });
  const float halves = best_ms([&] {
    for (int h = 0; h < 2; ++h) {
      const std::size_t at = h * bytes / 2;
      const void* s2[2] = {static_cast<char*>(buf[h]) + at, static_cast<char*>(buf[1 - h]) + at};
      void* d2[2] = {static_cast<char*>(buf[2 + h]) + at, static_cast<char*>(buf[3 - h]) + at};
      braid::kernels::cuda::reduce_multi(d2, 2, s2, 2, count / 2, DataType::f32, ReduceOp::sum, 0, stream);
    }
  });
  const float plain = best_ms([&] {
    plain_reduce2<<<65535, 256, 0, stream>>>(static_cast<const float4*>(buf[0]), static_cast<const float4*>(buf[1]),
                                              static_cast<float4*>(buf[2]), static_cast<float4*>(buf[3]), count / 4);
  });
  if (!ok(cudaStreamSynchronize(stream), "the kernels")) return 1;
  const double d2d = bytes / (copy * 1e-3) / 1e9;
  std::printf("%s: 256 MiB: copy %.1f us (%.0f GB/s); reduce_multi %.1f us (%.3f x copy), as two halves %.1f us "
              "(%.3f), with 2 sources fixed %.1f us (%.3f)\n",
              mode, copy * 1e3, d2d, one * 1e3, bytes / (one * 1e-3) / 1e9 / d2d, halves * 1e3,
              bytes / (halves * 1e-3) / 1e9 / d2d, plain * 1e3, bytes / (plain * 1e-3) / 1e9 / d2d);
  return 0;
}

// Each mode in its own process, forked before this one touches CUDA (a
// process that has used CUDA cannot fork a child that uses it), at most 15 s.
int main(int argc, char** argv) {
  int rc = 0;
  for (int i = 1; i < argc; ++i) {
    const char* mode = argv[i];
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
      int r = 1;
      if (std::strcmp(mode, "lazy") == 0) r = lazy(mode, false);
      else if (std::strcmp(mode, "loaded") == 0) r = lazy(mode, true);
      else if (std::strcmp(mode, "ipc") == 0) r = ipc(mode);
      else if (std::strcmp(mode, "thread") == 0) r = threaded(mode);
      else if (std::strcmp(mode, "eventpong") == 0) r = event_pong(mode);
      else if (std::strstr(mode, "pong") != nullptr) r = pong(mode);
      else if (std::strcmp(mode, "wake") == 0) r = wake(mode);
      else if (std::strcmp(mode, "reduce") == 0) r = reduce_alone(mode);
      else r = probe(mode);
      std::fflush(stdout);
      _exit(r);
    }
    bool killed = false;
    if (!reap_within(pid, std::chrono::seconds(15), &killed)) rc = 1;
    if (killed) std::printf("%s: no answer within 15 s\n", mode);
  }
  return rc;
}
