// Timing for the CUDA probes of scripts/ (cuda_gate_probe.cu, reduce_sweep.cu,
// allreduce_wait_probe.cu).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

// The shortest of trials - 1 runs of body() on `stream`, in milliseconds,
// timed by events recorded around it; one run more comes first, as a
// warm-up, and is not counted. A failed call leaves its run at 0 ms: check
// the stream afterwards.
template <typename Body>
float best_ms(cudaStream_t stream, int trials, Body&& body) {
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  float best = 1e9f;
  for (int trial = 0; trial < trials; ++trial) {
    cudaEventRecord(t0, stream);
    body();
    cudaEventRecord(t1, stream);
    cudaEventSynchronize(t1);
    float ms = 0;
    cudaEventElapsedTime(&ms, t0, t1);
    if (trial > 0) best = std::min(best, ms);
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  return best;
}

// The GPU's global timer in nanoseconds, for a kernel's waits to give up by.
__device__ inline unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
