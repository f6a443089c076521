// Helpers for checking the float training kernels against double-precision
// references: seeded random inputs, closeness with a relative tolerance and
// an absolute floor, and central-difference gradients of a scalar loss.
//
// The gradient check: the test writes the op's forward as a plain double
// loop, defines L = sum(out * R) for a fixed random R, and perturbs single
// elements of a double copy of an input by +-h. The float backward, run with
// dout = R, must give dL/dx at those elements. Double forward and h = 1e-4
// put the finite-difference error far below float rounding, so the tolerance
// only has to cover the float kernel.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace braid::test {

inline std::vector<float> random_floats(std::size_t count, std::uint32_t seed,
                                        float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(count);
  for (float& e : x) e = dist(gen);
  return x;
}

inline std::vector<std::int32_t> random_tokens(std::size_t count, int vocab, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> dist(0, vocab - 1);
  std::vector<std::int32_t> x(count);
  for (std::int32_t& e : x) e = dist(gen);
  return x;
}

inline std::vector<double> to_double(const std::vector<float>& x) {
  return std::vector<double>(x.begin(), x.end());
}

// sum_i out[i] * r[i]: the scalar loss whose gradient w.r.t. out is r.
inline double weighted_sum(const std::vector<double>& out, const std::vector<float>& r) {
  double sum = 0;
  for (std::size_t i = 0; i < out.size(); ++i) sum += out[i] * double(r[i]);
  return sum;
}

struct Tolerance {
  double rel = 1e-3;
  double abs = 1e-4;
};

inline bool close(double got, double want, Tolerance tol) {
  return std::abs(got - want) <= tol.abs + tol.rel * std::abs(want);
}

// Every element of a float result against its double reference.
inline void check_all_close(const std::string& what, const std::vector<float>& got,
                            const std::vector<double>& want, Tolerance tol = {1e-5, 1e-6}) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (close(got[i], want[i], tol)) continue;
    if (++bad <= 5) {
      INFO(what << "[" << i << "]: got " << got[i] << ", want " << want[i]);
      CHECK(false);
    }
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements out of tolerance");
  CHECK(bad == 0);
}

// Central difference of loss() in x[index] (x is what loss() reads).
inline double numeric_gradient(const std::function<double()>& loss, std::vector<double>& x,
                               std::size_t index, double h = 1e-4) {
  double saved = x[index];
  x[index] = saved + h;
  double plus = loss();
  x[index] = saved - h;
  double minus = loss();
  x[index] = saved;
  return (plus - minus) / (2 * h);
}

// Compares grad (the float backward's result for x) with central differences
// at `samples` seeded random indices (all of them when x is that small).
inline void check_gradient(const std::string& what, const std::function<double()>& loss,
                           std::vector<double>& x, const std::vector<float>& grad,
                           int samples = 12, Tolerance tol = {}) {
  REQUIRE(grad.size() == x.size());
  std::mt19937 gen(0x5eed);
  std::uniform_int_distribution<std::size_t> pick(0, x.size() - 1);
  bool all = x.size() <= std::size_t(samples);
  std::size_t count = all ? x.size() : std::size_t(samples);
  for (std::size_t s = 0; s < count; ++s) {
    std::size_t i = all ? s : pick(gen);
    double want = numeric_gradient(loss, x, i);
    INFO("d" << what << "[" << i << "]: backward " << grad[i] << ", finite difference " << want);
    CHECK(close(grad[i], want, tol));
  }
}

}  // namespace braid::test
