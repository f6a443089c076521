// Private helpers for the training kernels (not part of the public API):
// an exp the compiler can vectorise, and reductions with a fixed order.
//
// Why not expf/tanhf from libm: without -ffast-math GCC calls them one element
// at a time, and softmax over a 50k vocabulary or GELU over every MLP
// activation then costs more than the matmuls around them. exp_approx is
// branch-free float arithmetic plus an integer shift, so loops that call it
// become AVX2/AVX-512 code; its relative error is about 2 ulp.
//
// Why lanes: a float sum written as one accumulator is a dependency chain the
// compiler may not reorder (that would change the result), so it stays
// scalar. sum_lanes keeps kLanes independent partial sums, combined in a fixed
// order at the end: vectorised, and bit-identical from run to run.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace braid::kernels::cpu::detail {

// e^x, about 2 ulp. Below -87.3 (where e^x leaves the normal floats) it
// returns exactly 0; above 88.3 it returns e^88.3 (~2e38) rather than inf, so
// that tanh_approx stays finite.
inline float exp_approx(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;         // ln 2 split in two so that
  constexpr float kLn2Lo = -2.12194440e-4f;      // n * kLn2Hi is exact
  constexpr float kMin = -87.3f, kMax = 88.3f;
  float clamped = std::min(std::max(x, kMin), kMax);
  // x = n ln2 + r with |r| <= ln2/2; e^x = 2^n e^r. Adding and subtracting
  // 1.5 * 2^23 rounds to the nearest integer (floor would not vectorise).
  constexpr float kRound = 12582912.f;
  float n = (clamped * kLog2e + kRound) - kRound;
  float r = clamped - n * kLn2Hi;
  r = r - n * kLn2Lo;
  // Taylor series to degree 7: truncation error < 1e-8 relative on |r| <= 0.35.
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float result = p * std::bit_cast<float>(bits);
  return x < kMin ? 0.f : result;
}

// tanh(u) = 1 - 2 / (e^{2u} + 1): saturates to +-1 cleanly at both ends. Its
// absolute error (~1e-7) is what GELU needs; near 0 the relative error grows.
inline float tanh_approx(float u) {
  return 1.f - 2.f / (exp_approx(2.f * u) + 1.f);
}

inline constexpr int kLanes = 16;

// Combines kLanes partial sums pairwise, always in the same order.
inline float combine_lanes(float* acc) {
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

// sum_i x[i]
inline float sum_lanes(const float* x, std::size_t count) {
  float acc[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l];
  for (int l = 0; i < count; ++i, ++l) acc[l] += x[i];
  return combine_lanes(acc);
}

// sum_i x[i] * y[i]
inline float dot_lanes(const float* x, const float* y, std::size_t count) {
  float acc[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l] * y[i + l];
  for (int l = 0; i < count; ++i, ++l) acc[l] += x[i] * y[i];
  return combine_lanes(acc);
}

// dst[i] = e^(src[i] - shift); returns sum_i dst[i]. One pass: the softmax
// numerator and its normaliser. dst may alias src.
inline float exp_store_sum(float* dst, const float* src, float shift, std::size_t count) {
  float acc[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      float e = exp_approx(src[i + l] - shift);
      dst[i + l] = e;
      acc[l] += e;
    }
  for (int l = 0; i < count; ++i, ++l) {
    float e = exp_approx(src[i] - shift);
    dst[i] = e;
    acc[l] += e;
  }
  return combine_lanes(acc);
}

// max_i x[i] (count >= 1). Max is exact in any order; lanes only let it vectorise.
inline float max_lanes(const float* x, std::size_t count) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = x[0];
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
  for (int l = 0; i < count; ++i, ++l) acc[l] = x[i] > acc[l] ? x[i] : acc[l];
  for (int l = 1; l < kLanes; ++l) acc[0] = acc[l] > acc[0] ? acc[l] : acc[0];
  return acc[0];
}

}  // namespace braid::kernels::cpu::detail
