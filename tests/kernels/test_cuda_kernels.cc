// The CUDA kernels against their CPU spec (kernels/cpu/), on the same random
// inputs. Reductions must match bit for bit over every dtype x op (inputs are
// small integers for the float types, so every result is exact or correctly
// rounded the same way on both); training ops match within float tolerance,
// the embedding exactly (same order of additions).
//
// Built wherever nvcc is. Without a usable device every case returns early
// with a WARN that says why, so CI machines without a GPU stay green.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/gpt_ops.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/gpt_ops.h"
#include "kernels/cuda/reduce.h"

using namespace braid;
namespace cpu = braid::kernels::cpu;
namespace gpu = braid::kernels::cuda;

namespace {

#define SKIP_WITHOUT_CUDA_DEVICE()                              \
  do {                                                          \
    std::string why;                                            \
    if (!gpu::cuda_device_available(&why)) {                    \
      WARN("skipped: no CUDA device: " << why);                 \
      return;                                                   \
    }                                                           \
  } while (0)

void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// Device memory holding a copy of a host vector; read back with download().
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : count_(host.size()) {
    cuda_ok(cudaMalloc(&data_, bytes() + 16), "cudaMalloc");  // + 16: room for misaligned views
    cuda_ok(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() { return static_cast<T*>(data_); }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    cuda_ok(cudaDeviceSynchronize(), "kernel");
    cuda_ok(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host;
  }

 private:
  std::size_t bytes() const { return count_ * sizeof(T); }
  void* data_ = nullptr;
  std::size_t count_;
};

std::vector<float> uniform(std::size_t count, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

// |gpu - cpu| <= tol * (1 + |cpu|) element-wise; reports the first miss.
void check_close(const std::vector<float>& gpu_out, const std::vector<float>& cpu_out, float tol,
                 const char* what) {
  REQUIRE(gpu_out.size() == cpu_out.size());
  for (std::size_t i = 0; i < cpu_out.size(); ++i) {
    if (std::abs(gpu_out[i] - cpu_out[i]) <= tol * (1.f + std::abs(cpu_out[i]))) continue;
    FAIL_CHECK(what << "[" << i << "]: cuda " << gpu_out[i] << " vs cpu " << cpu_out[i]);
    return;
  }
}

// ---- reductions ----------------------------------------------------------------

// Bytes of `count` random elements: small integers for the float types (so
// sums, products and quotients are exact or rounded identically), the full
// range for the integer types (so wrapping and signed order are exercised).
std::vector<std::uint8_t> random_elements(DataType dtype, std::size_t count, std::mt19937& rng) {
  std::vector<std::uint8_t> bytes(count * dtype_bytes(dtype));
  std::uniform_int_distribution<int> small(-12, 12);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint8_t* at = bytes.data() + i * dtype_bytes(dtype);
    float f = float(small(rng));
    double d = f;
    std::uint16_t h = dtype == DataType::f16 ? cpu::f32_to_f16(f) : cpu::f32_to_bf16(f);
    std::uint64_t bits = (std::uint64_t(rng()) << 32) | rng();
    switch (dtype) {
      case DataType::f32: std::memcpy(at, &f, 4); break;
      case DataType::f64: std::memcpy(at, &d, 8); break;
      case DataType::f16:
      case DataType::bf16: std::memcpy(at, &h, 2); break;
      default: std::memcpy(at, &bits, dtype_bytes(dtype)); break;
    }
  }
  return bytes;
}

// Reduces through both versions, `offset` elements into the buffers (an
// odd offset takes the unaligned, scalar path), out of place and in place,
// then divides for avg; compares bytes.
void compare_reduce(DataType dtype, ReduceOp op, std::size_t count, std::size_t offset,
                    std::mt19937& rng) {
  const std::size_t width = dtype_bytes(dtype), skip = offset * width;
  std::vector<std::uint8_t> a = random_elements(dtype, count + offset, rng);
  std::vector<std::uint8_t> b = random_elements(dtype, count + offset, rng);
  std::vector<std::uint8_t> expected = a;
  cpu::reduce(expected.data() + skip, a.data() + skip, b.data() + skip, count, dtype, op);
  if (op == ReduceOp::avg) cpu::divide(expected.data() + skip, count, dtype, 3);

  DeviceBuffer<std::uint8_t> da(a), db(b), dout(a);
  gpu::reduce(dout.get() + skip, da.get() + skip, db.get() + skip, count, dtype, op);
  gpu::reduce(da.get() + skip, da.get() + skip, db.get() + skip, count, dtype, op);  // in place
  if (op == ReduceOp::avg) {
    gpu::divide(dout.get() + skip, count, dtype, 3);
    gpu::divide(da.get() + skip, count, dtype, 3);
  }
  INFO("dtype " << name(dtype) << ", op " << name(op) << ", count " << count << ", offset " << offset);
  CHECK(dout.download() == expected);
  CHECK(da.download() == expected);
}

// reduce_multi over 3 sources into 2 destinations, one of them source 0
// (in place), against the CPU reducing the sources left to right.
void compare_reduce_multi(DataType dtype, ReduceOp op, std::size_t count, std::size_t offset,
                          std::mt19937& rng) {
  const std::size_t width = dtype_bytes(dtype), skip = offset * width;
  std::vector<std::uint8_t> a = random_elements(dtype, count + offset, rng);
  std::vector<std::uint8_t> b = random_elements(dtype, count + offset, rng);
  std::vector<std::uint8_t> c = random_elements(dtype, count + offset, rng);
  std::vector<std::uint8_t> expected = a;
  cpu::reduce(expected.data() + skip, a.data() + skip, b.data() + skip, count, dtype, op);
  cpu::reduce(expected.data() + skip, expected.data() + skip, c.data() + skip, count, dtype, op);
  if (op == ReduceOp::avg) cpu::divide(expected.data() + skip, count, dtype, 3);

  DeviceBuffer<std::uint8_t> da(a), db(b), dc(c), dout(a);
  const void* srcs[] = {da.get() + skip, db.get() + skip, dc.get() + skip};
  void* dsts[] = {dout.get() + skip, da.get() + skip};
  gpu::reduce_multi(dsts, 2, srcs, 3, count, dtype, op, op == ReduceOp::avg ? 3 : 0);
  INFO("reduce_multi: dtype " << name(dtype) << ", op " << name(op) << ", count " << count << ", offset " << offset);
  CHECK(dout.download() == expected);
  CHECK(da.download() == expected);
}

}  // namespace

TEST_CASE("cuda reduce_multi (the fused IPC all-reduce step) matches the cpu bit for bit") {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(11);
  for (int t = 0; t < kNumDataTypes; ++t)
    for (int o = 0; o < kNumReduceOps; ++o)
      for (std::size_t count : {std::size_t(1), std::size_t(4099), std::size_t(1) << 18})
        for (std::size_t offset : {0, 1})
          if (can_reduce(DataType(t), ReduceOp(o)))  // not the bitwise ops on floats
            compare_reduce_multi(DataType(t), ReduceOp(o), count, offset, rng);
}

TEST_CASE("cuda reduce matches the cpu bit for bit on every dtype and op") {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(7);
  for (int t = 0; t < kNumDataTypes; ++t)
    for (int o = 0; o < kNumReduceOps; ++o)
      for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(13), std::size_t(4099),
                                std::size_t(1) << 20})
        for (std::size_t offset : {0, 1})
          if (can_reduce(DataType(t), ReduceOp(o)))  // not the bitwise ops on floats
            compare_reduce(DataType(t), ReduceOp(o), count, offset, rng);
}

// Min and max with NaNs (of either sign, quiet and signalling payloads) and
// zeros of both signs: the one quiet NaN and the sign order of zeros, the
// same bits as the CPU's in every float type. The hardware's f16/bf16
// conversions made every NaN 0x7fff, the CPU's 0x7e00/0x7fc0.
TEST_CASE("cuda min and max give the cpu's bits for NaNs and signed zeros") {
  SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<float> specials{0.0f, -0.0f, 1.0f, -2.0f, std::nanf(""), -std::nanf(""),
                                    std::numeric_limits<float>::signaling_NaN(), INFINITY, -INFINITY};
  for (DataType dtype : {DataType::f32, DataType::f64, DataType::f16, DataType::bf16}) {
    const std::size_t width = dtype_bytes(dtype), n = specials.size();
    std::vector<std::uint8_t> a(n * n * width), b(n * n * width);
    auto put = [&](std::uint8_t* at, float f) {
      double d = f;
      std::uint16_t h = dtype == DataType::f16 ? cpu::f32_to_f16(f) : cpu::f32_to_bf16(f);
      if (dtype == DataType::f32) std::memcpy(at, &f, 4);
      else if (dtype == DataType::f64) std::memcpy(at, &d, 8);
      else std::memcpy(at, &h, 2);
    };
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        put(a.data() + (i * n + j) * width, specials[i]);
        put(b.data() + (i * n + j) * width, specials[j]);
      }
    for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
      std::vector<std::uint8_t> expected(a.size());
      cpu::reduce(expected.data(), a.data(), b.data(), n * n, dtype, op);
      DeviceBuffer<std::uint8_t> da(a), db(b), dout(a);
      gpu::reduce(dout.get(), da.get(), db.get(), n * n, dtype, op);
      INFO("dtype " << name(dtype) << ", op " << name(op));
      CHECK(dout.download() == expected);
    }
  }
}

TEST_CASE("cuda preload launches every reduction kernel once and leaves no error behind") {
  SKIP_WITHOUT_CUDA_DEVICE();
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  CHECK_NOTHROW(gpu::preload(stream));
  CHECK_NOTHROW(gpu::preload(stream));  // again: nothing left over from the first
  CHECK(cudaGetLastError() == cudaSuccess);
  cuda_ok(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

TEST_CASE("cuda_device_available explains a false answer") {
  std::string why;
  if (!gpu::cuda_device_available(&why)) {
    CHECK_FALSE(why.empty());
    WARN("skipped: no CUDA device: " << why);
    return;
  }
  CHECK(why.empty());
}

// ---- training ops ----------------------------------------------------------------

TEST_CASE("cuda matmul matches the cpu") {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(1);
  const int N = 37, C = 64, OC = 45;
  auto inp = uniform(N * C, rng), weight = uniform(OC * C, rng), bias = uniform(OC, rng);
  auto dout = uniform(N * OC, rng), dinp = uniform(N * C, rng), dweight = uniform(OC * C, rng),
       dbias = uniform(OC, rng);
  for (bool with_bias : {true, false}) {
    std::vector<float> out(N * OC);
    DeviceBuffer<float> d_out(out), d_inp(inp), d_weight(weight), d_bias(bias);
    cpu::matmul_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, N, C, OC);
    gpu::matmul_forward(d_out.get(), d_inp.get(), d_weight.get(), with_bias ? d_bias.get() : nullptr, N, C, OC);
    check_close(d_out.download(), out, 1e-5f, "out");
  }
  DeviceBuffer<float> d_dinp(dinp), d_dweight(dweight), d_dbias(dbias), d_dout(dout), d_inp(inp),
      d_weight(weight);
  cpu::matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                       weight.data(), N, C, OC);
  gpu::matmul_backward(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_dout.get(), d_inp.get(),
                       d_weight.get(), N, C, OC);
  check_close(d_dinp.download(), dinp, 1e-5f, "dinp");
  check_close(d_dweight.download(), dweight, 1e-5f, "dweight");
  check_close(d_dbias.download(), dbias, 1e-5f, "dbias");
}

TEST_CASE("cuda layernorm matches the cpu") {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(2);
  const int N = 29, C = 100;
  auto inp = uniform(N * C, rng, -2.f, 3.f), weight = uniform(C, rng), bias = uniform(C, rng);
  auto dout = uniform(N * C, rng), dinp = uniform(N * C, rng), dweight = uniform(C, rng),
       dbias = uniform(C, rng);
  std::vector<float> out(N * C), mean(N), rstd(N);
  DeviceBuffer<float> d_out(out), d_mean(mean), d_rstd(rstd), d_inp(inp), d_weight(weight), d_bias(bias);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
  gpu::layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_weight.get(),
                         d_bias.get(), N, C);
  check_close(d_out.download(), out, 1e-5f, "out");
  check_close(d_mean.download(), mean, 1e-6f, "mean");
  check_close(d_rstd.download(), rstd, 1e-5f, "rstd");
  DeviceBuffer<float> d_dout(dout), d_dinp(dinp), d_dweight(dweight), d_dbias(dbias);
  cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                          weight.data(), mean.data(), rstd.data(), N, C);
  gpu::layernorm_backward(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_dout.get(), d_inp.get(),
                          d_weight.get(), d_mean.get(), d_rstd.get(), N, C);
  check_close(d_dinp.download(), dinp, 1e-5f, "dinp");
  check_close(d_dweight.download(), dweight, 1e-5f, "dweight");
  check_close(d_dbias.download(), dbias, 1e-5f, "dbias");
}

TEST_CASE("cuda gelu matches the cpu") {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(3);
  const std::size_t count = 100003;
  auto inp = uniform(count, rng, -6.f, 6.f), dout = uniform(count, rng), dinp = uniform(count, rng);
  std::vector<float> out(count);
  DeviceBuffer<float> d_out(out), d_inp(inp), d_dout(dout), d_dinp(dinp);
  cpu::gelu_forward(out.data(), inp.data(), count);
  gpu::gelu_forward(d_out.get(), d_inp.get(), count);
  check_close(d_out.download(), out, 1e-5f, "out");
  cpu::gelu_backward(dinp.data(), inp.data(), dout.data(), count);
  gpu::gelu_backward(d_dinp.get(), d_inp.get(), d_dout.get(), count);
  check_close(d_dinp.download(), dinp, 1e-5f, "dinp");
}

TEST_CASE("cuda attention matches the cpu") {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(4);
  const int B = 2, T = 70, NH = 3, HS = 16, C = NH * HS;
  auto qkv = uniform(std::size_t(B) * T * 3 * C, rng), dout = uniform(std::size_t(B) * T * C, rng);
  auto dqkv = uniform(qkv.size(), rng);
  std::vector<float> out(std::size_t(B) * T * C), att(std::size_t(B) * NH * T * T);
  DeviceBuffer<float> d_out(out), d_att(att), d_qkv(qkv), d_dout(dout), d_dqkv(dqkv);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
  gpu::attention_forward(d_out.get(), d_att.get(), d_qkv.get(), B, T, NH, HS);
  check_close(d_att.download(), att, 1e-5f, "att");
  check_close(d_out.download(), out, 1e-5f, "out");
  cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, NH, HS);
  gpu::attention_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att.get(), B, T, NH, HS);
  check_close(d_dqkv.download(), dqkv, 1e-4f, "dqkv");
}

TEST_CASE("cuda crossentropy matches the cpu") {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(5);
  for (int V : {10, 1000, 50257}) {
    const int N = 17;
    auto logits = uniform(std::size_t(N) * V, rng, -8.f, 8.f), dloss = uniform(N, rng);
    auto dlogits = uniform(logits.size(), rng);
    std::vector<std::int32_t> targets(N);
    for (auto& t : targets) t = std::int32_t(rng() % V);
    std::vector<float> losses(N), probs(logits.size());
    DeviceBuffer<float> d_losses(losses), d_probs(probs), d_logits(logits), d_dloss(dloss),
        d_dlogits(dlogits);
    DeviceBuffer<std::int32_t> d_targets(targets);
    cpu::crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
    gpu::crossentropy_forward(d_losses.get(), d_probs.get(), d_logits.get(), d_targets.get(), N, V);
    INFO("V " << V);
    check_close(d_losses.download(), losses, 1e-5f, "losses");
    check_close(d_probs.download(), probs, 1e-5f, "probs");
    cpu::crossentropy_backward(dlogits.data(), probs.data(), targets.data(), dloss.data(), N, V);
    gpu::crossentropy_backward(d_dlogits.get(), d_probs.get(), d_targets.get(), d_dloss.get(), N, V);
    check_close(d_dlogits.download(), dlogits, 1e-5f, "dlogits");
  }
}

TEST_CASE("cuda embedding matches the cpu exactly, repeated tokens included") {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(6);
  const int B = 3, T = 20, C = 40, V = 50, maxT = 24;
  std::vector<std::int32_t> tokens(B * T);
  for (auto& t : tokens) t = std::int32_t(rng() % 7) * 7;  // few distinct tokens, many repeats
  auto wte = uniform(std::size_t(V) * C, rng), wpe = uniform(std::size_t(maxT) * C, rng);
  auto dout = uniform(std::size_t(B) * T * C, rng);
  auto dwte = uniform(wte.size(), rng), dwpe = uniform(wpe.size(), rng);
  std::vector<float> out(std::size_t(B) * T * C);
  DeviceBuffer<float> d_out(out), d_wte(wte), d_wpe(wpe), d_dout(dout), d_dwte(dwte), d_dwpe(dwpe);
  DeviceBuffer<std::int32_t> d_tokens(tokens);
  cpu::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  gpu::embedding_forward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), B, T, C);
  CHECK(d_out.download() == out);
  cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  gpu::embedding_backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tokens.get(), B, T, C);
  CHECK(d_dwte.download() == dwte);
  CHECK(d_dwpe.download() == dwpe);
}

TEST_CASE("cuda adamw matches the cpu") {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(8);
  const std::size_t count = 10007;
  auto param = uniform(count, rng), m = uniform(count, rng, -0.1f, 0.1f), v = uniform(count, rng, 0.f, 0.01f);
  DeviceBuffer<float> d_param(param), d_m(m), d_v(v);
  for (long step = 1; step <= 3; ++step) {
    auto grad = uniform(count, rng);
    DeviceBuffer<float> d_grad(grad);
    cpu::AdamWParams p{1e-3f, 0.9f, 0.95f, 1e-8f, step == 2 ? 0.f : 0.1f, step};
    cpu::adamw_update(param.data(), grad.data(), m.data(), v.data(), count, p);
    gpu::adamw_update(d_param.get(), d_grad.get(), d_m.get(), d_v.get(), count, p);
    check_close(d_param.download(), param, 1e-6f, "param");
    check_close(d_m.download(), m, 1e-6f, "m");
    check_close(d_v.download(), v, 1e-6f, "v");
  }
}

TEST_CASE("cuda add, fill, scale and square_sum match the cpu") {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(9);
  for (std::size_t count : {std::size_t(1), std::size_t(1000), std::size_t(3) << 20}) {
    INFO(count << " elements");
    auto a = uniform(count, rng), b = uniform(count, rng);
    DeviceBuffer<float> d_a(a), d_b(b), d_out(std::vector<float>(count, 7.f));
    gpu::add(d_out.get(), d_a.get(), d_b.get(), count);
    std::vector<float> sum(count);
    for (std::size_t i = 0; i < count; ++i) sum[i] = a[i] + b[i];
    CHECK(d_out.download() == sum);  // one rounding, both sides
    gpu::scale(d_out.get(), 0.375f, count);
    for (float& x : sum) x *= 0.375f;
    CHECK(d_out.download() == sum);
    double squares = 0.0;
    for (float x : sum) squares += double(x) * x;
    const double on_gpu = gpu::square_sum(d_out.get(), count);
    CHECK(std::abs(on_gpu - squares) <= 1e-12 * squares);
    CHECK(gpu::square_sum(d_out.get(), count) == on_gpu);  // the same order every time
    gpu::fill(d_out.get(), -2.5f, count);
    CHECK(d_out.download() == std::vector<float>(count, -2.5f));
  }
}

TEST_CASE("cuda describe_device and the sgemm peak are plausible") {
  SKIP_WITHOUT_CUDA_DEVICE();
  const gpu::DeviceDescription d = gpu::describe_device(0);
  INFO(d.name << " sm_" << d.sm_major << d.sm_minor << ", " << d.multiprocessors << " SMs at " << d.clock_ghz
              << " GHz, fp32 peak " << d.fp32_peak_gflops << " GFLOP/s");
  CHECK(d.multiprocessors > 0);
  CHECK(d.clock_ghz > 0.3);
  const double sgemm = gpu::measure_sgemm_gflops();
  WARN(d.name << ": fp32 peak " << d.fp32_peak_gflops << " GFLOP/s, cuBLAS sgemm " << sgemm << " GFLOP/s");
  CHECK(sgemm > 0.0);
  CHECK(sgemm < 1.05 * d.fp32_peak_gflops);  // no TF32: fp32 cannot beat the fp32 peak
}

namespace {
bool cublas_mapped() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("libcublas") != std::string::npos) return true;
  return false;
}
}  // namespace

// Linking cuBLAS cost every process 0.6-2 s and 200 MB at start where the
// toolkit is installed (libcublasLt's initialisers), braid-train --help and
// CPU runs included: it is opened on first use. Needs no GPU.
TEST_CASE("cuBLAS is opened on first use, not when the process starts") {
  std::string why;
  // On a GPU an earlier case may have used it already.
  if (!gpu::cuda_device_available(&why)) CHECK_FALSE(cublas_mapped());
  const std::string file = gpu::blas_library();
  CHECK_THAT(file, Catch::Contains("libcublas.so."));
  CHECK(cublas_mapped());
  CHECK(gpu::blas_library() == file);  // once
}
