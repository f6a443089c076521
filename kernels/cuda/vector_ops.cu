// Element-wise helpers and a device description for the trainer on the GPU:
// the CUDA side of the few loops the CPU trainer writes inline (residual
// adds, gradient clipping, the gradient norm).

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/gpt_ops.h"

namespace braid::kernels::cuda {
namespace {

__global__ void add_kernel(float* out, const float* a, const float* b, std::size_t count) {
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    out[i] = a[i] + b[i];
  }
}

__global__ void fill_kernel(float* p, float value, std::size_t count) {
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) p[i] = value;
}

__global__ void scale_kernel(float* p, float factor, std::size_t count) {
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) p[i] *= factor;
}

// Each block writes the sum of squares of its grid-stride share, in double,
// to partial[blockIdx.x]; the host adds the partials in block order, so the
// result depends only on `count`, never on scheduling.
__global__ void square_sum_kernel(double* partial, const float* p, std::size_t count) {
  __shared__ double lane[detail::kThreads];
  double sum = 0.0;
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    double x = p[i];
    sum += x * x;
  }
  lane[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) lane[threadIdx.x] += lane[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = lane[0];
}

constexpr std::size_t kSquareSumBlocks = 256;

}  // namespace

void add(float* out, const float* a, const float* b, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  add_kernel<<<detail::grid_for(count), detail::kThreads, 0, stream>>>(out, a, b, count);
  detail::check_launch("add_kernel");
}

void fill(float* p, float value, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  fill_kernel<<<detail::grid_for(count), detail::kThreads, 0, stream>>>(p, value, count);
  detail::check_launch("fill_kernel");
}

void scale(float* p, float factor, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  scale_kernel<<<detail::grid_for(count), detail::kThreads, 0, stream>>>(p, factor, count);
  detail::check_launch("scale_kernel");
}

double square_sum(const float* p, std::size_t count, cudaStream_t stream) {
  if (count == 0) return 0.0;
  const unsigned blocks = detail::grid_for(count, kSquareSumBlocks);
  double* partial = nullptr;
  detail::check(cudaMallocAsync(reinterpret_cast<void**>(&partial), blocks * sizeof(double), stream),
                "cudaMallocAsync (square_sum)");
  square_sum_kernel<<<blocks, detail::kThreads, 0, stream>>>(partial, p, count);
  detail::check_launch("square_sum_kernel");
  std::vector<double> host(blocks);
  detail::check(cudaMemcpyAsync(host.data(), partial, blocks * sizeof(double), cudaMemcpyDeviceToHost, stream),
                "cudaMemcpyAsync (square_sum)");
  detail::check(cudaFreeAsync(partial, stream), "cudaFreeAsync (square_sum)");
  detail::check(cudaStreamSynchronize(stream), "square_sum");
  double sum = 0.0;
  for (double x : host) sum += x;
  return sum;
}

DeviceDescription describe_device(int device) {
  DeviceDescription d;
  d.ordinal = device;
  cudaDeviceProp prop{};
  detail::check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  d.name = prop.name;
  d.sm_major = prop.major;
  d.sm_minor = prop.minor;
  d.multiprocessors = prop.multiProcessorCount;
  int clock_khz = 0;
  detail::check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device), "cudaDeviceGetAttribute (clock)");
  d.clock_ghz = clock_khz * 1e-6;
  d.memory_bytes = prop.totalGlobalMem;
  // FP32 lanes per SM: 64 on sm_80 (A100) and sm_60/70, 128 on sm_86/89
  // (Ampere/Ada consumer) and sm_90 (Hopper) and later.
  const int lanes = (prop.major == 8 && prop.minor == 0) || prop.major < 8 ? 64 : 128;
  d.fp32_peak_gflops = 2.0 * lanes * d.multiprocessors * d.clock_ghz;
  return d;
}

double measure_sgemm_gflops(cudaStream_t stream) {
  constexpr int kN = 4096;
  constexpr int kRepeats = 5;
  const std::size_t count = std::size_t(kN) * kN;
  float *a = nullptr, *b = nullptr, *c = nullptr;
  detail::check(cudaMalloc(reinterpret_cast<void**>(&a), 3 * count * sizeof(float)), "cudaMalloc (sgemm peak)");
  b = a + count;
  c = b + count;
  fill(a, 0.5f, 2 * count, stream);
  cudaEvent_t start, stop;
  detail::check(cudaEventCreate(&start), "cudaEventCreate");
  detail::check(cudaEventCreate(&stop), "cudaEventCreate");
  double best_ms = 1e30;
  try {
    for (int r = 0; r <= kRepeats; ++r) {  // r == 0 warms cuBLAS up
      detail::check(cudaEventRecord(start, stream), "cudaEventRecord");
      matmul_forward(c, a, b, nullptr, kN, kN, kN, stream);
      detail::check(cudaEventRecord(stop, stream), "cudaEventRecord");
      detail::check(cudaEventSynchronize(stop), "sgemm peak");
      float ms = 0.0f;
      detail::check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      if (r > 0) best_ms = std::min(best_ms, double(ms));
    }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(a);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  return 2.0 * kN * kN * double(kN) / (best_ms * 1e-3) * 1e-9;
}

}  // namespace braid::kernels::cuda
