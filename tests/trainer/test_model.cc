// The GPT against a double-precision reference: forward loss, gradients by
// central differences, and the pieces strategies will use (param table,
// init, units and hooks, pipeline stages).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "model_fixtures.h"
#include "reference_gpt.h"
#include "runtime/errors.h"
#include "trainer/model/init.h"

namespace braid::trainer {
namespace {

using test::random_tokens;
using test::randomize;
using test::tiny_config;

constexpr int kB = 2, kT = 5;  // T below block_size 6 on purpose

struct Batch {
  std::vector<std::int32_t> tokens = random_tokens(kB * kT, 11);
  std::vector<std::int32_t> targets = random_tokens(kB * kT, 12);
};

std::vector<double> as_double(const FlatBuffer& b) { return {b.data(), b.data() + b.count()}; }

TEST_CASE("forward matches the double-precision reference", "[model]") {
  const GptConfig c = tiny_config();
  Gpt model(c, ModelLayout::whole(c), nullptr);
  randomize(model, 3);
  Batch batch;
  Activations acts = model.make_activations(kB, kT);
  const float loss = model.forward(acts, batch.tokens.data(), batch.targets.data());
  const double ref = test::reference_loss(c, model.table(), as_double(model.params()), batch.tokens, batch.targets, kB, kT);
  CHECK(loss == Approx(ref).epsilon(1e-5));
}

TEST_CASE("backward matches central differences of the reference", "[model][gradcheck]") {
  const GptConfig c = tiny_config();
  Gpt model(c, ModelLayout::whole(c), nullptr);
  randomize(model, 5);
  Batch batch;
  Activations acts = model.make_activations(kB, kT);
  model.forward(acts, batch.tokens.data(), batch.targets.data());
  model.backward(acts, 1.0f / (kB * kT));

  std::vector<double> p = as_double(model.params());
  constexpr double kEps = 1e-4;
  double worst = 0;
  for (const ParamView& v : model.table().views()) {
    for (std::size_t k = 0; k < 5; ++k) {
      const std::size_t i = v.offset + (k * 7919 + 13) % v.count();
      const double saved = p[i];
      p[i] = saved + kEps;
      const double up = test::reference_loss(c, model.table(), p, batch.tokens, batch.targets, kB, kT);
      p[i] = saved - kEps;
      const double down = test::reference_loss(c, model.table(), p, batch.tokens, batch.targets, kB, kT);
      p[i] = saved;
      const double numeric = (up - down) / (2 * kEps);
      const double analytic = model.grads().data()[i];
      INFO(v.name << " element " << i - v.offset << ": analytic " << analytic << ", numeric " << numeric);
      CHECK(std::abs(analytic - numeric) <= 1e-2 * std::abs(numeric) + 1e-5);
      worst = std::max(worst, std::abs(analytic - numeric) / (std::abs(numeric) + 1e-5));
    }
  }
  WARN("gradient check: worst relative error " << worst);
}

TEST_CASE("backward accumulates: two passes give twice the gradient", "[model]") {
  const GptConfig c = tiny_config();
  Gpt model(c, ModelLayout::whole(c), nullptr);
  randomize(model, 7);
  Batch batch;
  Activations acts = model.make_activations(kB, kT);
  model.forward(acts, batch.tokens.data(), batch.targets.data());
  model.backward(acts, 0.1f);
  std::vector<float> once(model.grads().data(), model.grads().data() + model.grads().count());
  model.forward(acts, batch.tokens.data(), batch.targets.data());
  model.backward(acts, 0.1f);
  for (std::size_t i = 0; i < once.size(); ++i) REQUIRE(model.grads().data()[i] == Approx(2 * once[i]).margin(1e-7));
}

TEST_CASE("the param table holds GPT-2's tensors contiguously", "[model]") {
  const GptConfig c{3, 4, 16, 10, 256};
  const ParamTable t = ParamTable::gpt(c, ModelLayout::whole(c));
  const std::size_t C = 16, L = 3;
  CHECK(t.count() == 256 * C + 10 * C + L * (12 * C * C + 13 * C) + 2 * C);
  std::size_t next = 0;
  for (const ParamView& v : t.views()) {
    CHECK(v.offset == next);
    CHECK(v.shape == v.full_shape);
    CHECK(v.decay == (v.shape.size() == 2));
    next += v.count();
  }
  CHECK(t.find("h.1.attn.c_attn.weight").shape == std::vector<std::int64_t>{48, 16});
  CHECK(t.find("h.2.mlp.c_proj.weight").shape == std::vector<std::int64_t>{16, 64});
  REQUIRE(t.units().size() == 5);
  CHECK(t.units()[0].name == "embedding");
  CHECK(t.units()[t.block_unit(1)].name == "h.1");
  CHECK(t.units()[t.head_unit()].range.end() == t.count());
  CHECK_THROWS_AS(t.find("h.3.ln_1.weight"), InvalidUsage);
}

TEST_CASE("init is GPT-2's, deterministic, and the same in every layout", "[model]") {
  const GptConfig c{2, 4, 32, 16, 256};
  const ParamTable t = ParamTable::gpt(c, ModelLayout::whole(c));
  std::vector<float> a(t.count()), b(t.count()), other(t.count());
  init_parameters(c, ModelLayout::whole(c), t, a, 42);
  init_parameters(c, ModelLayout::whole(c), t, b, 42);
  init_parameters(c, ModelLayout::whole(c), t, other, 43);
  CHECK(a == b);
  CHECK(a != other);
  auto stddev = [&](const char* name) {
    const ParamView& v = t.find(name);
    double s = 0;
    for (std::size_t i = 0; i < v.count(); ++i) s += double(a[v.offset + i]) * a[v.offset + i];
    return std::sqrt(s / v.count());
  };
  CHECK(stddev("wte.weight") == Approx(0.02).epsilon(0.05));
  CHECK(stddev("h.0.mlp.c_fc.weight") == Approx(0.02).epsilon(0.05));
  CHECK(stddev("h.1.attn.c_proj.weight") == Approx(0.02 / std::sqrt(4.0)).epsilon(0.1));
  CHECK(stddev("h.0.attn.c_attn.bias") == 0.0);
  CHECK(a[t.find("h.1.ln_2.weight").offset] == 1.0f);

  // Tensor parallel rank 1 of 2 holds q, k and v rows of heads 2 and 3.
  ModelLayout tp = ModelLayout::whole(c);
  tp.tp_size = 2;
  tp.tp_rank = 1;
  const ParamTable tt = ParamTable::gpt(c, tp);
  std::vector<float> part(tt.count());
  init_parameters(c, tp, tt, part, 42);
  const ParamView& whole_attn = t.find("h.0.attn.c_attn.weight");
  const ParamView& part_attn = tt.find("h.0.attn.c_attn.weight");
  REQUIRE(part_attn.shape == std::vector<std::int64_t>{48, 32});
  for (int g = 0; g < 3; ++g) {  // q, k, v
    CHECK(std::memcmp(&part[part_attn.offset + g * 16 * 32], &a[whole_attn.offset + (g * 32 + 16) * 32],
                      16 * 32 * sizeof(float)) == 0);
  }
  const ParamView& part_proj = tt.find("h.0.attn.c_proj.weight");
  CHECK(part[part_proj.offset + 32] == a[t.find("h.0.attn.c_proj.weight").offset + 2 * 32 + 16]);  // row 2, col 16
}

// Records every hook call.
struct RecordingHooks : ModelHooks {
  std::vector<std::string> calls;
  std::vector<Range> ready;
  void before_unit(int u, Pass p) override { calls.push_back("+" + std::to_string(u) + (p == Pass::kForward ? "f" : "b")); }
  void after_unit(int u, Pass p) override { calls.push_back("-" + std::to_string(u) + (p == Pass::kForward ? "f" : "b")); }
  void grads_ready(int u, Range r) override {
    calls.push_back("ready " + std::to_string(u));
    ready.push_back(r);
  }
};

TEST_CASE("hooks bracket every unit and report gradients in backward order", "[model]") {
  const GptConfig c = tiny_config();
  Gpt model(c, ModelLayout::whole(c), nullptr);
  randomize(model, 1);
  RecordingHooks hooks;
  model.set_hooks(&hooks);
  Batch batch;
  Activations acts = model.make_activations(kB, kT);
  model.forward(acts, batch.tokens.data(), batch.targets.data());
  model.backward(acts, 1.0f);
  // Units: 0 embedding, 1 h.0, 2 h.1, 3 head (which also reads wte of unit 0).
  const std::vector<std::string> expected = {
      "+0f", "-0f", "+1f", "-1f", "+2f", "-2f", "+3f", "+0f", "-0f", "-3f",
      "+3b", "+0b", "-0b", "-3b", "ready 3", "+2b", "-2b", "ready 2", "+1b", "-1b", "ready 1",
      "+0b", "-0b", "ready 0"};
  CHECK(hooks.calls == expected);
  REQUIRE(hooks.ready.size() == 4);
  CHECK(hooks.ready[0] == model.table().units()[3].range);
  CHECK(hooks.ready[3] == model.table().units()[0].range);
}

TEST_CASE("two pipeline stages compose to the whole model", "[model]") {
  const GptConfig c = tiny_config();
  Gpt whole(c, ModelLayout::whole(c), nullptr);
  randomize(whole, 9);
  ModelLayout first{0, 1, 0, 1, true, false}, last{0, 1, 1, 2, false, true};
  Gpt s0(c, first, nullptr), s1(c, last, nullptr);
  for (Gpt* stage : {&s0, &s1}) {
    for (const ParamView& v : stage->table().views()) {
      std::memcpy(stage->params().data() + v.offset, whole.params().data() + whole.table().find(v.name).offset,
                  v.count() * sizeof(float));
    }
  }
  Batch batch;
  Activations aw = whole.make_activations(kB, kT), a0 = s0.make_activations(kB, kT), a1 = s1.make_activations(kB, kT);
  const float loss = whole.forward(aw, batch.tokens.data(), batch.targets.data());
  whole.backward(aw, 0.1f);

  s0.forward(a0, batch.tokens.data(), nullptr);
  a1.set_shape(kB, kT);
  std::memcpy(a1.input(), s0.stage_output(a0), sizeof(float) * kB * kT * c.n_embd);  // "send_forward"
  CHECK(s1.forward(a1, nullptr, batch.targets.data()) == loss);
  s1.backward(a1, 0.1f);
  std::memcpy(a0.dresidual(), a1.dresidual(), sizeof(float) * kB * kT * c.n_embd);  // "send_backward"
  s0.backward(a0, 0.1f);

  for (const ParamView& v : whole.table().views()) {
    const float* g = whole.grads().data() + v.offset;
    std::vector<float> got(v.count(), 0.0f);
    for (Gpt* stage : {&s0, &s1}) {  // the tied wte's two halves add up
      if (!stage->table().contains(v.name)) continue;
      const float* s = stage->grads().data() + stage->table().find(v.name).offset;
      for (std::size_t i = 0; i < v.count(); ++i) got[i] += s[i];
    }
    for (std::size_t i = 0; i < v.count(); ++i) {
      INFO(v.name << " element " << i);
      REQUIRE(got[i] == Approx(g[i]).margin(1e-6));
    }
  }
}

TEST_CASE("a tensor-parallel model refuses to run without communication hooks", "[model]") {
  const GptConfig c = tiny_config();
  ModelLayout tp = ModelLayout::whole(c);
  tp.tp_size = 2;
  Gpt model(c, tp, nullptr);
  Batch batch;
  Activations acts = model.make_activations(kB, kT);
  CHECK_THROWS_AS(model.forward(acts, batch.tokens.data(), batch.targets.data()), InvalidUsage);
}

}  // namespace
}  // namespace braid::trainer
