// tools/bench/device.h on the CUDA runtime.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "runtime/errors.h"
#include "tools/bench/device.h"

namespace braid::comm::bench_device {
namespace {

cudaStream_t the_stream = nullptr;

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw SystemError("CUDA " + what + ": " + cudaGetErrorString(status));
}

}  // namespace

void init(int local_rank) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount (is there a GPU and a driver?)");
  if (count == 0) throw SystemError("--device cuda, but no CUDA device is visible");
  check(cudaSetDevice(local_rank % count), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&the_stream, cudaStreamNonBlocking), "cudaStreamCreate");
}

void* stream() { return the_stream; }

std::byte* allocate(std::size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), "cudaMalloc of " + std::to_string(bytes) + " bytes");
  return static_cast<std::byte*>(p);
}

void release(std::byte* device) { cudaFree(device); }

// On the bench's stream, which is non-blocking: a plain cudaMemcpy runs on
// the legacy default stream, which does not wait for the collectives'
// stream, and a small one from pageable memory returns before its DMA is
// done. Both wrote the input of an in-place call under the collective
// reading it (wrong values below 64 KiB on an H200, issue 19).
void upload(std::byte* device, const std::byte* host, std::size_t bytes) {
  check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, the_stream), "upload");
  check(cudaStreamSynchronize(the_stream), "upload");
}

void download(std::byte* host, const std::byte* device, std::size_t bytes) {
  check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, the_stream), "download");
  check(cudaStreamSynchronize(the_stream), "download");
}

void synchronize(bool null_stream) {
  check(cudaStreamSynchronize(null_stream ? nullptr : the_stream), "the timed calls' stream");
}

double measure_copy_gbps(std::size_t bytes) {
  std::byte* a = allocate(bytes);
  std::byte* b = allocate(bytes);
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  double best = 0;
  for (int trial = 0; trial < 5; ++trial) {
    check(cudaEventRecord(start, the_stream), "cudaEventRecord");
    check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, the_stream), "cudaMemcpyAsync");
    check(cudaEventRecord(stop, the_stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (trial > 0 && ms > 0) best = std::max(best, bytes / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  release(a);
  release(b);
  return best;
}

}  // namespace braid::comm::bench_device
