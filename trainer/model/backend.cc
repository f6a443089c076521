// The CPU backend (kernels/cpu) and the choice of backend by device. The
// CUDA backend lives in backend_cuda.cc, or backend_none.cc refuses it.
#include "trainer/model/backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/errors.h"

namespace braid::trainer {

namespace k = braid::kernels::cpu;

namespace detail {
// backend_cuda.cc / backend_none.cc.
const Backend& cuda_backend();
}  // namespace detail

namespace {

// The CPU's peak, measured: the best of kPeakRepeats products of two
// kPeakN x kPeakN matrices through the run's own GEMM (matmul_forward,
// OpenBLAS sgemm) with the BLAS threads set now, after one warm-up. The
// fastest of several is the least disturbed by whatever else runs: a
// measurement can be slowed by load but never made faster than the cores
// allow. 512^3 (0.27 GFLOP, a few ms a product) is past the size where
// sgemm's rate levels off, larger than the trainer's small GEMMs.
constexpr int kPeakN = 512;
constexpr int kPeakRepeats = 5;

double measure_gemm_gflops() {
  const std::size_t n = kPeakN;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 7) * 0.125f - 0.375f;
    b[i] = static_cast<float>(i % 5) * 0.25f - 0.5f;
  }
  auto product = [&] { k::matmul_forward(c.data(), a.data(), b.data(), nullptr, kPeakN, kPeakN, kPeakN); };
  product();
  double best_s = 1e30;
  for (int r = 0; r < kPeakRepeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    product();
    best_s = std::min(best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * kPeakN * kPeakN * kPeakN / best_s * 1e-9;
}

class CpuBackend final : public Backend {
 public:
  std::string describe() const override { return "cpu"; }
  // Measured at every call, with the BLAS threads the caller has set.
  double peak_gflops(int ranks, int threads) const override { return ranks * measure_gemm_gflops(); }
  std::string peak_source(int ranks, int threads) const override {
    return std::to_string(ranks) + " rank(s) x best of " + std::to_string(kPeakRepeats) + " sgemm " +
           std::to_string(kPeakN) + "^3 with " + std::to_string(threads) + " BLAS thread(s)";
  }
  bool peak_is_measured() const override { return true; }

  void* allocate(std::size_t bytes, std::string_view what) const override {
    constexpr std::size_t kAlign = 64;
    const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
      throw SystemError("cannot allocate " + std::to_string(bytes) + " bytes of " + std::string(what) +
                        "; use a smaller model or batch");
    }
    std::memset(p, 0, rounded);
    return p;
  }
  void release(void* p) const override { std::free(p); }
  void zero(void* p, std::size_t bytes) const override {
    if (bytes > 0) std::memset(p, 0, bytes);
  }
  void to_host(void* host, const void* src, std::size_t bytes) const override {
    if (bytes > 0) std::memmove(host, src, bytes);
  }
  void from_host(void* dst, const void* host, std::size_t bytes) const override {
    if (bytes > 0) std::memmove(dst, host, bytes);
  }
  void* comm_stream() const override { return nullptr; }
  void order_comm_after_compute() const override {}

  void add(float* out, const float* a, const float* b, std::size_t count) const override {
    for (std::size_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
  }
  void fill(float* p, float value, std::size_t count) const override { std::fill_n(p, count, value); }
  void scale(float* p, float factor, std::size_t count) const override {
    for (std::size_t i = 0; i < count; ++i) p[i] *= factor;
  }
  double square_sum(const float* p, std::size_t count) const override {
    double sum = 0.0;
    for (std::size_t i = 0; i < count; ++i) sum += static_cast<double>(p[i]) * p[i];
    return sum;
  }

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                      int OC) const override {
    k::matmul_forward(out, inp, weight, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int N, int C, int OC) const override {
    k::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int N, int C) const override {
    k::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C) const override {
    k::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void gelu_forward(float* out, const float* inp, std::size_t count) const override {
    k::gelu_forward(out, inp, count);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t count) const override {
    k::gelu_backward(dinp, inp, dout, count);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS) const override {
    k::attention_forward(out, att, qkv, B, T, NH, HS);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T,
                          int NH, int HS) const override {
    k::attention_backward(dqkv, dout, qkv, att, B, T, NH, HS);
  }
  void crossentropy_forward(float* losses, float* probs, const float* logits, const std::int32_t* targets, int N,
                            int V) const override {
    k::crossentropy_forward(losses, probs, logits, targets, N, V);
  }
  void crossentropy_backward(float* dlogits, const float* probs, const std::int32_t* targets, const float* dloss,
                             int N, int V) const override {
    k::crossentropy_backward(dlogits, probs, targets, dloss, N, V);
  }
  void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                         int C) const override {
    k::embedding_forward(out, tokens, wte, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T,
                          int C) const override {
    k::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t count,
                    const k::AdamWParams& p) const override {
    k::adamw_update(param, grad, m, v, count, p);
  }
};

}  // namespace

std::string_view device_name(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::kCpu;
  if (text == "cuda") return Device::kCuda;
  throw InvalidUsage("unknown --device '" + std::string(text) + "'; choose cpu or cuda");
}

const Backend& backend(Device device) {
  static const CpuBackend cpu;
  return device == Device::kCuda ? detail::cuda_backend() : cpu;
}

}  // namespace braid::trainer
