// The CUDA backend: device memory from cudaMalloc (which CUDA IPC can share
// with the other ranks of the host), kernels/cuda on the legacy default
// stream, so that the communicator's calls on the default stream order
// themselves after the kernels that produce their inputs; a non-blocking
// stream for the strategies' bucketed collectives, fenced after those
// kernels by an event.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <stdexcept>

#include "kernels/cuda/gpt_ops.h"
#include "kernels/cuda/reduce.h"
#include "runtime/errors.h"
#include "trainer/model/backend.h"

namespace braid::trainer {

namespace g = braid::kernels::cuda;

namespace {

int requested_local_rank = 0;

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    throw SystemError("CUDA: " + what + " failed: " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
  }
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    std::string why;
    if (!g::cuda_device_available(&why)) throw SystemError("--device cuda: no usable CUDA device: " + why);
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    device_count_ = count;
    ordinal_ = requested_local_rank % count;
    check(cudaSetDevice(ordinal_), "cudaSetDevice(" + std::to_string(ordinal_) + ")");
    info_ = g::describe_device(ordinal_);
    g::load_blas();  // before any collective: loading cuBLAS waits for the whole device
    // Non-blocking: the legacy default stream, where the kernels run, does
    // not wait for it (a collective's gate holds only this stream).
    check(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking), "cudaStreamCreate (collectives)");
    check(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming), "cudaEventCreate");
  }

  std::string describe() const override {
    return "cuda:" + std::to_string(ordinal_) + " (" + info_.name + ", sm_" + std::to_string(info_.sm_major) +
           std::to_string(info_.sm_minor) + ", " + std::to_string(info_.multiprocessors) + " SMs, " +
           std::to_string(info_.memory_bytes >> 30) + " GiB)";
  }
  double peak_gflops(int ranks, int) const override { return info_.fp32_peak_gflops * devices(ranks); }
  std::string peak_source(int ranks, int) const override {
    char text[200];
    std::snprintf(text, sizeof(text),
                  "%d x %s fp32 peak, 2 x FP32 lanes x %d SMs x %.2f GHz; a cuBLAS 4096^3 sgemm reaches %.0f GFLOP/s",
                  devices(ranks), info_.name.c_str(), info_.multiprocessors, info_.clock_ghz, measured_sgemm());
    return text;
  }

  void* allocate(std::size_t bytes, std::string_view what) const override {
    select();
    void* p = nullptr;
    cudaError_t status = cudaMalloc(&p, std::max<std::size_t>(bytes, 1));
    if (status != cudaSuccess) {
      cudaGetLastError();  // clear it: an allocation failure is not sticky
      throw SystemError("cannot allocate " + std::to_string(bytes) + " bytes of " + std::string(what) + " on " +
                        describe() + ": " + cudaGetErrorString(status) + "; use a smaller model or batch");
    }
    check(cudaMemset(p, 0, std::max<std::size_t>(bytes, 1)), "cudaMemset");
    return p;
  }
  void release(void* p) const override {
    if (p != nullptr) cudaFree(p);  // no throw: runs in destructors
  }
  void zero(void* p, std::size_t bytes) const override {
    if (bytes > 0) check(cudaMemsetAsync(p, 0, bytes, nullptr), "cudaMemsetAsync");
  }
  void to_host(void* host, const void* src, std::size_t bytes) const override {
    if (bytes > 0) check(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
  void from_host(void* dst, const void* host, std::size_t bytes) const override {
    // Synchronous: `host` may be a temporary that dies when this returns.
    if (bytes > 0) check(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  void* comm_stream() const override { return comm_stream_; }
  void order_comm_after_compute() const override {
    check(cudaEventRecord(compute_done_, nullptr), "cudaEventRecord");
    check(cudaStreamWaitEvent(comm_stream_, compute_done_, 0), "cudaStreamWaitEvent");
  }

  void add(float* out, const float* a, const float* b, std::size_t count) const override { g::add(out, a, b, count); }
  void fill(float* p, float value, std::size_t count) const override { g::fill(p, value, count); }
  void scale(float* p, float factor, std::size_t count) const override { g::scale(p, factor, count); }
  double square_sum(const float* p, std::size_t count) const override { return g::square_sum(p, count); }

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                      int OC) const override {
    g::matmul_forward(out, inp, weight, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int N, int C, int OC) const override {
    g::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int N, int C) const override {
    g::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C) const override {
    g::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void gelu_forward(float* out, const float* inp, std::size_t count) const override {
    g::gelu_forward(out, inp, count);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t count) const override {
    g::gelu_backward(dinp, inp, dout, count);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS) const override {
    g::attention_forward(out, att, qkv, B, T, NH, HS);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T,
                          int NH, int HS) const override {
    g::attention_backward(dqkv, dout, qkv, att, B, T, NH, HS);
  }
  void crossentropy_forward(float* losses, float* probs, const float* logits, const std::int32_t* targets, int N,
                            int V) const override {
    g::crossentropy_forward(losses, probs, logits, targets, N, V);
  }
  void crossentropy_backward(float* dlogits, const float* probs, const std::int32_t* targets, const float* dloss,
                             int N, int V) const override {
    g::crossentropy_backward(dlogits, probs, targets, dloss, N, V);
  }
  void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                         int C) const override {
    g::embedding_forward(out, tokens, wte, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T,
                          int C) const override {
    g::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t count,
                    const kernels::cpu::AdamWParams& p) const override {
    g::adamw_update(param, grad, m, v, count, p);
  }

 private:
  // The device is per host thread: a thread other than the one that built
  // the backend (a strategy's helper) selects it before allocating.
  void select() const { check(cudaSetDevice(ordinal_), "cudaSetDevice"); }
  double measured_sgemm() const {
    std::call_once(sgemm_once_, [this] { sgemm_gflops_ = g::measure_sgemm_gflops(); });
    return sgemm_gflops_;
  }

  int devices(int ranks) const { return std::max(1, std::min(ranks, device_count_)); }

  int ordinal_ = 0;
  int device_count_ = 1;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;
  g::DeviceDescription info_;
  mutable std::once_flag sgemm_once_;
  mutable double sgemm_gflops_ = 0.0;
};

}  // namespace

void set_cuda_local_rank(int local_rank) { requested_local_rank = local_rank < 0 ? 0 : local_rank; }

bool cuda_usable(std::string* why) { return g::cuda_device_available(why); }

namespace detail {
const Backend& cuda_backend() {
  static const CudaBackend cuda;
  return cuda;
}
}  // namespace detail

}  // namespace braid::trainer
