// Causal attention against a plain double-precision reference: forward,
// gradients by central differences, the causal mask (the future never leaks
// into the past), and run-to-run determinism. Sequence lengths cover one
// block and several blocks of the kernel's causal blocking (64 rows).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/gpt_ops.h"
#include "tests/kernels/gradcheck.h"

using namespace braid::kernels::cpu;
using namespace braid::test;

namespace {

struct Shape {
  int B, T, NH, HS;
  int C() const { return NH * HS; }
  std::size_t qkv_count() const { return std::size_t(B) * T * 3 * C(); }
  std::size_t out_count() const { return std::size_t(B) * T * C(); }
  std::size_t att_count() const { return std::size_t(B) * NH * T * T; }
};

// out[b, t, h*HS + d] = sum_{j <= t} softmax_j(q_t . k_j / sqrt(HS)) v_j[d]
std::vector<double> attention_reference(const std::vector<double>& qkv, Shape s) {
  const int C = s.C(), C3 = 3 * C;
  std::vector<double> out(s.out_count()), w(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const double* q = &qkv[(b * s.T + t) * C3 + h * s.HS];
        double max = -1e300, sum = 0;
        for (int j = 0; j <= t; ++j) {
          const double* k = &qkv[(b * s.T + j) * C3 + C + h * s.HS];
          double dot = 0;
          for (int d = 0; d < s.HS; ++d) dot += q[d] * k[d];
          w[j] = dot / std::sqrt(double(s.HS));
          max = std::max(max, w[j]);
        }
        for (int j = 0; j <= t; ++j) sum += (w[j] = std::exp(w[j] - max));
        double* o = &out[(b * s.T + t) * C + h * s.HS];
        for (int j = 0; j <= t; ++j) {
          const double* v = &qkv[(b * s.T + j) * C3 + 2 * C + h * s.HS];
          for (int d = 0; d < s.HS; ++d) o[d] += w[j] / sum * v[d];
        }
      }
  return out;
}

}  // namespace

TEST_CASE("attention matches the reference forward and finite-difference gradients") {
  Shape s = GENERATE(Shape{2, 7, 2, 4}, Shape{1, 150, 2, 8});  // one block; three, ragged
  INFO("B " << s.B << " T " << s.T << " NH " << s.NH << " HS " << s.HS);
  auto qkv = random_floats(s.qkv_count(), 81, -1.5f, 1.5f);
  auto r = random_floats(s.out_count(), 82);
  auto qkv_d = to_double(qkv);

  std::vector<float> out(s.out_count()), att(s.att_count()), dqkv(s.qkv_count());
  attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.HS);
  check_all_close("out", out, attention_reference(qkv_d, s), {1e-5, 1e-6});

  attention_backward(dqkv.data(), r.data(), qkv.data(), att.data(), s.B, s.T, s.NH, s.HS);
  auto loss = [&] { return weighted_sum(attention_reference(qkv_d, s), r); };
  check_gradient("qkv", loss, qkv_d, dqkv, 60);
}

TEST_CASE("attention probabilities are causal rows that sum to 1") {
  Shape s{2, 130, 3, 8};
  auto qkv = random_floats(s.qkv_count(), 83, -3.f, 3.f);
  std::vector<float> out(s.out_count()), att(s.att_count());
  attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.HS);
  for (std::size_t row = 0; row < std::size_t(s.B) * s.NH * s.T; ++row) {
    int t = int(row % s.T);
    const float* a = &att[row * s.T];
    double sum = 0;
    for (int j = 0; j <= t; ++j) sum += a[j];
    INFO("row " << row << " (t = " << t << ")");
    REQUIRE(std::abs(sum - 1) < 1e-5);
    for (int j = t + 1; j < s.T; ++j) REQUIRE(a[j] == 0.f);
  }
}

TEST_CASE("attention output before a token does not depend on that token's key or value") {
  Shape s{1, 150, 2, 8};
  int future = GENERATE(1, 63, 64, 100, 149);  // block edges and the middle of a block
  auto qkv = random_floats(s.qkv_count(), 84);
  std::vector<float> out(s.out_count()), att(s.att_count());
  attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.HS);

  auto changed = qkv;  // new k and v for token `future`, q kept
  const int C = s.C();
  auto noise = random_floats(2 * C, 85, -5.f, 5.f);
  std::memcpy(&changed[std::size_t(future) * 3 * C + C], noise.data(), sizeof(float) * 2 * C);
  std::vector<float> out2(s.out_count()), att2(s.att_count());
  attention_forward(out2.data(), att2.data(), changed.data(), s.B, s.T, s.NH, s.HS);

  INFO("changed token " << future);
  std::size_t past = std::size_t(future) * C;
  CHECK(std::memcmp(out.data(), out2.data(), past * sizeof(float)) == 0);
  CHECK(std::memcmp(&out[past], &out2[past], C * sizeof(float)) != 0);  // and it does affect itself
}

TEST_CASE("attention is bit-identical from run to run and accumulates its gradient") {
  Shape s{2, 192, 3, 16};
  auto qkv = random_floats(s.qkv_count(), 86), dout = random_floats(s.out_count(), 87);
  auto run = [&] {
    std::vector<float> out(s.out_count()), att(s.att_count()), dqkv(s.qkv_count());
    attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.HS);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.NH, s.HS);
    return std::vector<std::vector<float>>{out, att, dqkv};
  };
  auto first = run();
  CHECK(first == run());

  std::vector<float> twice(s.qkv_count());
  for (int k = 0; k < 2; ++k)
    attention_backward(twice.data(), dout.data(), qkv.data(), first[1].data(), s.B, s.T, s.NH, s.HS);
  for (std::size_t i = 0; i < twice.size(); ++i) {
    INFO("dqkv[" << i << "]");
    REQUIRE(close(twice[i], 2.0 * first[2][i], {1e-6, 1e-7}));
  }
}
