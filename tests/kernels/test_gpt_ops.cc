// The GPT training kernels (matmul, layernorm, GELU, cross-entropy,
// embedding, AdamW) against plain double-precision references: forwards
// element by element, backwards against central differences of
// L = sum(out * R) (gradcheck.h). Attention has its own file.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/gpt_ops.h"
#include "kernels/cpu/vec_math.h"
#include "tests/kernels/gradcheck.h"

using namespace braid::kernels::cpu;
using namespace braid::test;

namespace {

// ---- double references ------------------------------------------------------

std::vector<double> matmul_reference(const std::vector<double>& inp, const std::vector<double>& w,
                                     const std::vector<double>* bias, int N, int C, int OC) {
  std::vector<double> out(std::size_t(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double sum = bias ? (*bias)[o] : 0.0;
      for (int c = 0; c < C; ++c) sum += inp[n * C + c] * w[o * C + c];
      out[n * OC + o] = sum;
    }
  return out;
}

std::vector<double> layernorm_reference(const std::vector<double>& inp, const std::vector<double>& w,
                                        const std::vector<double>& bias, int N, int C) {
  std::vector<double> out(inp.size());
  for (int n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    for (int c = 0; c < C; ++c) mean += inp[n * C + c] / C;
    for (int c = 0; c < C; ++c) var += (inp[n * C + c] - mean) * (inp[n * C + c] - mean) / C;
    double rstd = 1 / std::sqrt(var + 1e-5);
    for (int c = 0; c < C; ++c) out[n * C + c] = (inp[n * C + c] - mean) * rstd * w[c] + bias[c];
  }
  return out;
}

std::vector<double> gelu_reference(const std::vector<double>& inp) {
  std::vector<double> out(inp.size());
  for (std::size_t i = 0; i < inp.size(); ++i) {
    double x = inp[i];
    out[i] = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  }
  return out;
}

// Returns losses; fills probs.
std::vector<double> crossentropy_reference(std::vector<double>& probs, const std::vector<double>& logits,
                                           const std::vector<std::int32_t>& targets, int N, int V) {
  std::vector<double> losses(N);
  probs.assign(logits.size(), 0.0);
  for (int n = 0; n < N; ++n) {
    double max = logits[n * V], sum = 0;
    for (int v = 0; v < V; ++v) max = std::max(max, logits[n * V + v]);
    for (int v = 0; v < V; ++v) sum += std::exp(logits[n * V + v] - max);
    for (int v = 0; v < V; ++v) probs[n * V + v] = std::exp(logits[n * V + v] - max) / sum;
    losses[n] = -std::log(probs[n * V + targets[n]]);
  }
  return losses;
}

std::vector<double> embedding_reference(const std::vector<std::int32_t>& tokens,
                                        const std::vector<double>& wte, const std::vector<double>& wpe,
                                        int B, int T, int C) {
  std::vector<double> out(std::size_t(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        out[(b * T + t) * C + c] = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];
  return out;
}

}  // namespace

// ---- matmul ----------------------------------------------------------------

TEST_CASE("matmul forward matches the reference and its backward matches finite differences") {
  const int N = 7, C = 19, OC = 11;  // odd sizes: no kernel-friendly multiples
  auto inp = random_floats(N * C, 1), w = random_floats(OC * C, 2), bias = random_floats(OC, 3);
  auto r = random_floats(N * OC, 4);
  auto inp_d = to_double(inp), w_d = to_double(w), bias_d = to_double(bias);

  std::vector<float> out(N * OC);
  matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  check_all_close("out", out, matmul_reference(inp_d, w_d, &bias_d, N, C, OC));
  matmul_forward(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
  check_all_close("out (no bias)", out, matmul_reference(inp_d, w_d, nullptr, N, C, OC));

  std::vector<float> dinp(N * C), dw(OC * C), dbias(OC);
  matmul_backward(dinp.data(), dw.data(), dbias.data(), r.data(), inp.data(), w.data(), N, C, OC);
  auto loss = [&] { return weighted_sum(matmul_reference(inp_d, w_d, &bias_d, N, C, OC), r); };
  check_gradient("inp", loss, inp_d, dinp);
  check_gradient("weight", loss, w_d, dw);
  check_gradient("bias", loss, bias_d, dbias);

  SECTION("null dinp and dbias are skipped, dweight is the same") {
    std::vector<float> dw2(OC * C);
    matmul_backward(nullptr, dw2.data(), nullptr, r.data(), inp.data(), w.data(), N, C, OC);
    CHECK(dw2 == dw);
  }
}

TEST_CASE("matmul forward at a trainer-like shape matches the reference") {
  const int N = 64, C = 96, OC = 288;
  auto inp = random_floats(N * C, 5), w = random_floats(OC * C, 6, -0.1f, 0.1f);
  auto bias = random_floats(OC, 7);
  auto bias_d = to_double(bias);
  std::vector<float> out(N * OC);
  matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  check_all_close("out", out, matmul_reference(to_double(inp), to_double(w), &bias_d, N, C, OC),
                  {1e-5, 1e-5});
}

// ---- layernorm -------------------------------------------------------------

TEST_CASE("layernorm forward matches the reference and its backward matches finite differences") {
  const int N = 5, C = 37;
  auto inp = random_floats(N * C, 11, 2.f, 4.f);  // offset mean: the centring matters
  auto w = random_floats(C, 12, 0.5f, 1.5f), bias = random_floats(C, 13);
  auto r = random_floats(N * C, 14);
  auto inp_d = to_double(inp), w_d = to_double(w), bias_d = to_double(bias);

  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), bias.data(), N, C);
  check_all_close("out", out, layernorm_reference(inp_d, w_d, bias_d, N, C), {1e-4, 1e-5});
  for (int n = 0; n < N; ++n) {
    double m = 0;
    for (int c = 0; c < C; ++c) m += inp_d[n * C + c] / C;
    CHECK(close(mean[n], m, {1e-6, 1e-6}));
  }

  std::vector<float> dinp(N * C), dw(C), dbias(C);
  layernorm_backward(dinp.data(), dw.data(), dbias.data(), r.data(), inp.data(), w.data(),
                     mean.data(), rstd.data(), N, C);
  auto loss = [&] { return weighted_sum(layernorm_reference(inp_d, w_d, bias_d, N, C), r); };
  check_gradient("inp", loss, inp_d, dinp, 20);
  check_gradient("weight", loss, w_d, dw);
  check_gradient("bias", loss, bias_d, dbias);
}

// ---- GELU ------------------------------------------------------------------

TEST_CASE("gelu forward matches tanh-GELU and its backward matches finite differences") {
  auto inp = random_floats(203, 21, -6.f, 6.f);
  inp.insert(inp.end(), {0.f, -0.f, 1e-6f, -1e-6f, 20.f, -20.f, 80.f, -80.f});
  auto r = random_floats(inp.size(), 22);
  auto inp_d = to_double(inp);
  std::vector<float> out(inp.size()), dinp(inp.size());
  gelu_forward(out.data(), inp.data(), inp.size());
  check_all_close("out", out, gelu_reference(inp_d), {1e-5, 1e-6});
  CHECK(out[out.size() - 2] == 80.f);
  CHECK(std::abs(out.back()) < 1e-30f);

  gelu_backward(dinp.data(), inp.data(), r.data(), inp.size());
  auto loss = [&] { return weighted_sum(gelu_reference(inp_d), r); };
  check_gradient("inp", loss, inp_d, dinp, int(inp.size()), {1e-4, 1e-5});
}

TEST_CASE("exp_approx is within a few ulp of exp over the float range") {
  double worst = 0;
  for (float x = -87.f; x < 88.f; x += 0.01f) {
    double want = std::exp(double(x));
    worst = std::max(worst, std::abs(detail::exp_approx(x) - want) / want);
  }
  CHECK(worst < 4e-7);
  CHECK(detail::exp_approx(0.f) == 1.f);
  CHECK(detail::exp_approx(-1000.f) < 1e-37f);
  CHECK(std::isfinite(detail::exp_approx(1000.f)));
}

// ---- cross-entropy ---------------------------------------------------------

TEST_CASE("crossentropy forward matches the reference and its backward matches finite differences") {
  const int N = 4, V = 53;
  auto logits = random_floats(N * V, 31, -4.f, 4.f);
  auto targets = random_tokens(N, V, 32);
  auto r = random_floats(N, 33);
  auto logits_d = to_double(logits);

  std::vector<float> losses(N), probs(N * V);
  crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  std::vector<double> probs_d;
  check_all_close("losses", losses, crossentropy_reference(probs_d, logits_d, targets, N, V));
  check_all_close("probs", probs, probs_d);

  std::vector<float> dlogits(N * V);
  crossentropy_backward(dlogits.data(), probs.data(), targets.data(), r.data(), N, V);
  auto loss = [&] {
    std::vector<double> p;
    return weighted_sum(crossentropy_reference(p, logits_d, targets, N, V), r);
  };
  check_gradient("logits", loss, logits_d, dlogits, N * V);
  for (int n = 0; n < N; ++n) CHECK(dlogits[n * V + targets[n]] * r[n] <= 0.f);
}

TEST_CASE("crossentropy of uniform logits is ln V; huge logits stay finite") {
  const int N = 3, V = 50257;
  std::vector<float> logits(std::size_t(N) * V, 7.25f), losses(N), probs(logits.size());
  std::vector<std::int32_t> targets = {0, 12345, V - 1};
  crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  for (float loss : losses) CHECK(close(loss, std::log(double(V)), {1e-6, 1e-6}));
  CHECK(close(probs[777], 1.0 / V, {1e-5, 0}));

  // Logits far beyond exp's range: the max-subtraction keeps it finite.
  std::vector<float> big = {1e4f, -1e4f, 3e4f, 0.f};
  std::vector<float> big_probs(4), big_loss(1);
  std::vector<std::int32_t> t = {0};
  crossentropy_forward(big_loss.data(), big_probs.data(), big.data(), t.data(), 1, 4);
  CHECK(close(big_loss[0], 2e4, {1e-6, 0}));
  CHECK(big_probs[2] == 1.f);
  CHECK(big_probs[1] == 0.f);
}

// ---- embedding -------------------------------------------------------------

TEST_CASE("embedding forward matches the reference and its backward adds repeated tokens") {
  const int B = 2, T = 5, C = 9, V = 4;  // V < B*T: tokens repeat
  auto tokens = random_tokens(B * T, V, 41);
  auto wte = random_floats(V * C, 42), wpe = random_floats(T * C, 43), r = random_floats(B * T * C, 44);
  auto wte_d = to_double(wte), wpe_d = to_double(wpe);

  std::vector<float> out(B * T * C);
  embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  check_all_close("out", out, embedding_reference(tokens, wte_d, wpe_d, B, T, C), {1e-7, 0});

  std::vector<float> dwte(V * C), dwpe(T * C);
  embedding_backward(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C);
  auto loss = [&] { return weighted_sum(embedding_reference(tokens, wte_d, wpe_d, B, T, C), r); };
  check_gradient("wte", loss, wte_d, dwte, V * C);
  check_gradient("wpe", loss, wpe_d, dwpe, T * C);
}

// ---- AdamW -----------------------------------------------------------------

TEST_CASE("adamw matches a hand-computed two-step example") {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.1; p0 = 1.
  // Step 1, g = 0.5:   p = 1 * (1 - 0.01) = 0.99; m = 0.05; v = 0.00025;
  //   mhat = 0.5, vhat = 0.25;  p = 0.99 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.890000002
  // Step 2, g = -0.25: p = 0.890000002 * 0.99 = 0.88110000198;
  //   m = 0.045 - 0.025 = 0.02; v = 0.00024975 + 0.0000625 = 0.00031225;
  //   mhat = 0.02 / 0.19 = 0.105263158; vhat = 0.00031225 / 0.001999 = 0.156203102;
  //   p = 0.88110000198 - 0.1 * 0.105263158 / (0.395225391 + 1e-8) = 0.854466299
  // The second element has weight decay 0 and the same gradients:
  //   step 1: 1 - 0.1 = 0.900000002; step 2: 0.900000002 - 0.0266337 = 0.873366297
  AdamWParams p{0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, 1};
  AdamWParams p_no_decay = p;
  p_no_decay.weight_decay = 0.f;
  float param[2] = {1.f, 1.f}, m[2] = {}, v[2] = {};
  float g1[2] = {0.5f, 0.5f}, g2[2] = {-0.25f, -0.25f};

  adamw_update(param, g1, m, v, 1, p);
  adamw_update(param + 1, g1 + 1, m + 1, v + 1, 1, p_no_decay);
  CHECK(param[0] == Approx(0.890000002).margin(1e-6));
  CHECK(param[1] == Approx(0.900000002).margin(1e-6));
  // m and v carry float's rounding of 1 - beta (0.999f is not 0.999): relative checks.
  CHECK(m[0] == Approx(0.05).epsilon(1e-6));
  CHECK(v[0] == Approx(0.00025).epsilon(1e-4));

  p.step = p_no_decay.step = 2;
  adamw_update(param, g2, m, v, 1, p);
  adamw_update(param + 1, g2 + 1, m + 1, v + 1, 1, p_no_decay);
  CHECK(param[0] == Approx(0.854466299).margin(1e-6));
  CHECK(param[1] == Approx(0.873366297).margin(1e-6));
  CHECK(m[0] == Approx(0.02).epsilon(1e-5));
  CHECK(v[0] == Approx(0.00031225).epsilon(1e-4));
}

TEST_CASE("adamw over a long range matches the double formula") {
  const std::size_t count = 1001;
  auto param = random_floats(count, 51), grad = random_floats(count, 52);
  auto m = random_floats(count, 53, -0.1f, 0.1f), v = random_floats(count, 54, 0.f, 0.01f);
  std::vector<double> want(count);
  AdamWParams p{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 7};
  for (std::size_t i = 0; i < count; ++i) {
    double lr = p.lr, wd = p.weight_decay, b1 = p.beta1, b2 = p.beta2, g = grad[i];
    double mi = b1 * m[i] + (1 - b1) * g, vi = b2 * v[i] + (1 - b2) * g * g;
    double mhat = mi / (1 - std::pow(b1, 7)), vhat = vi / (1 - std::pow(b2, 7));
    want[i] = param[i] - lr * wd * param[i] - lr * mhat / (std::sqrt(vhat) + double(p.eps));
  }
  adamw_update(param.data(), grad.data(), m.data(), v.data(), count, p);
  check_all_close("param", param, want, {1e-6, 1e-7});
}

// ---- properties shared by every backward ------------------------------------

TEST_CASE("every backward accumulates into its gradients") {
  const int N = 6, C = 20, OC = 12, V = 17;
  auto x = random_floats(N * C, 61), w = random_floats(OC * C, 62), b = random_floats(OC, 63);
  auto dy = random_floats(N * OC, 64), dx_c = random_floats(N * C, 65);
  auto lw = random_floats(C, 66), lb = random_floats(C, 67);
  auto targets = random_tokens(N, V, 68);
  auto logits = random_floats(N * V, 69), dloss = random_floats(N, 70);
  std::vector<float> mean(N), rstd(N), scratch(N * C), probs(N * V), losses(N);
  layernorm_forward(scratch.data(), mean.data(), rstd.data(), x.data(), lw.data(), lb.data(), N, C);
  crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);

  // Runs `backward` once and twice on zeroed gradients: twice must be double.
  auto twice_is_double = [](const char* what, std::vector<std::vector<float>*> grads, auto backward) {
    for (auto* g : grads) std::fill(g->begin(), g->end(), 0.f);
    backward();
    std::vector<std::vector<float>> once;
    for (auto* g : grads) once.push_back(*g);
    backward();
    for (std::size_t k = 0; k < grads.size(); ++k)
      for (std::size_t i = 0; i < once[k].size(); ++i) {
        INFO(what << " gradient " << k << "[" << i << "]");
        REQUIRE(close((*grads[k])[i], 2.0 * once[k][i], {1e-6, 1e-7}));
      }
  };
  std::vector<float> g1(N * C), g2(OC * C), g3(OC), g4(C), g5(C), g6(N * V), g7(OC * C), g8(N * C);
  twice_is_double("matmul", {&g1, &g2, &g3}, [&] {
    matmul_backward(g1.data(), g2.data(), g3.data(), dy.data(), x.data(), w.data(), N, C, OC);
  });
  twice_is_double("layernorm", {&g1, &g4, &g5}, [&] {
    layernorm_backward(g1.data(), g4.data(), g5.data(), dx_c.data(), x.data(), lw.data(),
                       mean.data(), rstd.data(), N, C);
  });
  twice_is_double("gelu", {&g1}, [&] { gelu_backward(g1.data(), x.data(), dx_c.data(), g1.size()); });
  twice_is_double("crossentropy", {&g6}, [&] {
    crossentropy_backward(g6.data(), probs.data(), targets.data(), dloss.data(), N, V);
  });
  std::vector<std::int32_t> tokens = {1, 3, 1, 0, 2, 1};  // N tokens, B = 2, T = 3
  twice_is_double("embedding", {&g7, &g8}, [&] {
    embedding_backward(g7.data(), g8.data(), dx_c.data(), tokens.data(), 2, 3, C);
  });
}

TEST_CASE("every kernel is bit-identical from run to run, with 1 and 2 BLAS threads") {
  int threads = GENERATE(1, 2);
  set_blas_threads(threads);
  const int N = 256, C = 192, OC = 768, V = 1000;
  auto x = random_floats(N * C, 71), w = random_floats(OC * C, 72), b = random_floats(OC, 73);
  auto dy = random_floats(N * OC, 74), lw = random_floats(C, 75), logits = random_floats(N * V, 76);
  auto targets = random_tokens(N, V, 77);
  auto run = [&] {
    std::vector<float> out(N * OC), dx(N * C), dw(OC * C), db(OC);
    matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC);
    std::vector<float> ln(N * C), mean(N), rstd(N), dlw(C), dlb(C);
    layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), lw.data(), b.data(), N, C);
    layernorm_backward(dx.data(), dlw.data(), dlb.data(), ln.data(), x.data(), lw.data(),
                       mean.data(), rstd.data(), N, C);
    std::vector<float> g(N * OC);
    gelu_forward(g.data(), out.data(), g.size());
    gelu_backward(out.data(), g.data(), dy.data(), g.size());
    std::vector<float> losses(N), probs(N * V), dlogits(N * V);
    crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
    crossentropy_backward(dlogits.data(), probs.data(), targets.data(), losses.data(), N, V);
    return std::vector<std::vector<float>>{out, dx, dw, db, ln, dlw, dlb, g, losses, dlogits};
  };
  auto first = run();
  auto second = run();
  for (std::size_t k = 0; k < first.size(); ++k) {
    INFO("result " << k << " with " << threads << " BLAS threads");
    CHECK(first[k] == second[k]);  // float ==: bit-identical apart from NaN, which none are
  }
  set_blas_threads(1);
}
