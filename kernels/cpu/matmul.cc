// Linear layer (out = inp @ weight^T + bias) through OpenBLAS sgemm, plus
// the BLAS thread setting and the single-thread sgemm peak the trainer uses
// as the denominator of its MFU.
//
// All three products are one row-major sgemm each; the transposes fall out
// of weight being stored [OC, C]:
//   forward  out     = inp  @ weight^T   (N x C) (OC x C)^T
//   backward dinp   += dout @ weight     (N x OC) (OC x C)
//            dweight += dout^T @ inp     (OC x N) (N x C)
// The bias is written into `out` first and the sgemm accumulates onto it
// (beta = 1), so the forward touches `out` once. Gradients accumulate with
// beta = 1. OpenBLAS splits sgemm work over M and N, never K, so results do
// not depend on the thread count's scheduling: deterministic run to run.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "kernels/cpu/gpt_ops.h"

namespace braid::kernels::cpu {

void set_blas_threads(int threads) { openblas_set_num_threads(std::max(threads, 1)); }

void map_blas_buffers() {
  constexpr int kSide = 512;  // large enough for OpenBLAS to take its buffers and wake every thread
  std::vector<float> a(std::size_t{kSide} * kSide, 0.f), c(a.size());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kSide, kSide, kSide, 1.f, a.data(), kSide, a.data(), kSide, 0.f,
              c.data(), kSide);
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int N, int C, int OC) {
  float beta = 0.f;
  if (bias != nullptr) {
    for (int n = 0; n < N; ++n) std::memcpy(out + std::size_t(n) * OC, bias, sizeof(float) * OC);
    beta = 1.f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C,
              1.f, inp, C, weight, C, beta, out, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC) {
  if (dinp != nullptr)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC,
                1.f, dout, OC, weight, C, 1.f, dinp, C);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N,
              1.f, dout, OC, inp, C, 1.f, dweight, C);
  if (dbias != nullptr) {
    // Rows in order, columns vectorised: a fixed summation order per column.
    for (int n = 0; n < N; ++n) {
      const float* row = dout + std::size_t(n) * OC;
      for (int o = 0; o < OC; ++o) dbias[o] += row[o];
    }
  }
}

double measure_sgemm_gflops() {
  constexpr int kN = 1024;
  constexpr int kRepeats = 5;
  std::vector<float> a(std::size_t(kN) * kN), b(a.size()), c(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = float(i % 7) * 0.125f - 0.375f;
    b[i] = float(i % 5) * 0.25f - 0.5f;
  }
  int saved_threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kN, kN, kN,
                1.f, a.data(), kN, b.data(), kN, 0.f, c.data(), kN);
  };
  run();  // warm-up: pages, caches, OpenBLAS buffers
  // Best of several: on a shared machine the fastest run is the one least
  // disturbed, which is what a peak means.
  double best_s = 1e30;
  for (int r = 0; r < kRepeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    run();
    std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    best_s = std::min(best_s, elapsed.count());
  }
  openblas_set_num_threads(saved_threads);
  return 2.0 * kN * kN * kN / best_s * 1e-9;
}

}  // namespace braid::kernels::cpu
