// Where the trainer's buffers live and the math that runs on them.
//
// Every flat buffer (FlatBuffer) belongs to one Device. The model, the
// optimizer and the strategies never touch a buffer's elements themselves:
// they go through the Backend of its device, which is kernels/cpu on the CPU
// and kernels/cuda (cuBLAS, our kernels, the legacy default stream) on a
// CUDA device. The communicator accepts device pointers: calls made and
// waited at once follow the default stream; a strategy's bucketed
// collectives run on comm_stream() so that they overlap backward.
//
// On CUDA every call is asynchronous on the default stream except the ones
// that hand values to the host (to_host, square_sum, which synchronise).
// Tokens and targets are int32 and share the float buffers' storage.
//
// Departure from DESIGN.md, which puts "devices and memory" in runtime/:
// runtime/device.h still says where a pointer lives (for the communicator),
// but the trainer's allocations are here, beside the ops that run on them,
// so that one object answers for a device's memory, kernels and stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/cpu/gpt_ops.h"

namespace braid::trainer {

enum class Device { kCpu, kCuda };

// "cpu", "cuda".
std::string_view device_name(Device device);
// Throws InvalidUsage listing the choices.
Device parse_device(std::string_view text);

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu", or "cuda:0 (NVIDIA H200, sm_90, 132 SMs)".
  virtual std::string describe() const = 0;
  // Peak float32 GFLOP/s of the hardware that `ranks` ranks of one host
  // with `threads` BLAS threads each run on (the MFU denominator), and how
  // it was found. CUDA: the documented fp32 peak of each device they share
  // (min(ranks, visible devices)). CPU (peak_is_measured()): `ranks` x a
  // measurement this call makes, the best of a few sgemms with the BLAS
  // threads the caller has set (`threads` names them); the trainer has
  // every rank measure at once with ranks = 1, so that they share the
  // cores as the run does, and sums (train/peak.h).
  virtual double peak_gflops(int ranks, int threads) const = 0;
  virtual std::string peak_source(int ranks, int threads) const = 0;
  virtual bool peak_is_measured() const { return false; }

  // Memory. allocate() returns `bytes` of zeroed memory (64-byte aligned on
  // the CPU) or throws SystemError naming `what`.
  virtual void* allocate(std::size_t bytes, std::string_view what) const = 0;
  virtual void release(void* p) const = 0;
  virtual void zero(void* p, std::size_t bytes) const = 0;
  virtual void to_host(void* host, const void* src, std::size_t bytes) const = 0;  // waits
  virtual void from_host(void* dst, const void* host, std::size_t bytes) const = 0;
  // The stream a strategy's collectives on this device's buffers run on
  // (a cudaStream_t; null on the CPU), apart from the compute stream so
  // that a bucket's all-reduce overlaps the rest of backward, as on the
  // CPU the engine's thread overlaps the training thread. Before each such
  // call, order_comm_after_compute() makes it start after the kernels
  // queued so far; its results are read only after Work::wait.
  virtual void* comm_stream() const = 0;
  virtual void order_comm_after_compute() const = 0;

  // Element-wise.
  virtual void add(float* out, const float* a, const float* b, std::size_t count) const = 0;
  virtual void fill(float* p, float value, std::size_t count) const = 0;
  virtual void scale(float* p, float factor, std::size_t count) const = 0;
  // Sum of squares, in double (waits for the value).
  virtual double square_sum(const float* p, std::size_t count) const = 0;

  // The GPT ops, as documented in kernels/cpu/gpt_ops.h.
  virtual void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                              int OC) const = 0;
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, int N, int C, int OC) const = 0;
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                 const float* bias, int N, int C) const = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                  const float* weight, const float* mean, const float* rstd, int N,
                                  int C) const = 0;
  virtual void gelu_forward(float* out, const float* inp, std::size_t count) const = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t count) const = 0;
  virtual void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH,
                                 int HS) const = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                                  int T, int NH, int HS) const = 0;
  virtual void crossentropy_forward(float* losses, float* probs, const float* logits,
                                    const std::int32_t* targets, int N, int V) const = 0;
  virtual void crossentropy_backward(float* dlogits, const float* probs, const std::int32_t* targets,
                                     const float* dloss, int N, int V) const = 0;
  virtual void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                                 int B, int T, int C) const = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B,
                                  int T, int C) const = 0;
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t count,
                            const kernels::cpu::AdamWParams& p) const = 0;
};

// The backend of `device`, created on first use. For kCuda: the device
// local_rank % (visible devices) of this process, selected on the calling
// thread; throws InvalidUsage in a build without CUDA and SystemError where
// no device can be used (with the driver's reason).
const Backend& backend(Device device);

// Which CUDA device backend(kCuda) takes: set before its first use
// (braid-train passes the rank's local rank). Default 0.
void set_cuda_local_rank(int local_rank);

// Whether backend(kCuda) can work here; otherwise false with the reason.
bool cuda_usable(std::string* why);

}  // namespace braid::trainer
