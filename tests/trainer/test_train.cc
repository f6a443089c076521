// The training loop: the loss falls, a resumed run is bit-identical to an
// uninterrupted one, gradient accumulation matches one big batch, and the
// schedule, FLOP count and memory accounting say what they should.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "model_fixtures.h"
#include "trainer/train/generate.h"
#include "trainer/train/trainer.h"

namespace braid::trainer {
namespace {

namespace fs = std::filesystem;

using test::synthetic_corpus;

TrainOptions tiny_options() {
  TrainOptions o;
  o.model = GptConfig{2, 2, 16, 16, 256};
  o.batch_size = 4;
  o.steps = 6;
  o.lr = 1e-2f;
  o.min_lr = 1e-3f;
  o.warmup_steps = 2;
  o.eval_batches = 1;
  o.seed = 21;
  return o;
}

bool same(const FlatBuffer& a, const FlatBuffer& b) {
  return std::memcmp(a.data(), b.data(), a.count() * sizeof(float)) == 0;
}

TEST_CASE("the loss falls on the default corpus", "[train]") {
  if (!fs::is_directory(kDefaultCorpusDir)) {
    WARN("skipped: " << kDefaultCorpusDir << " is missing (install Debian's fortunes package)");
    return;
  }
  const TextCorpus corpus = load_default_corpus();
  TrainOptions o = tiny_options();
  o.model = GptConfig{2, 2, 32, 32, 256};
  o.batch_size = 8;
  o.steps = 60;
  o.lr = 3e-3f;
  o.warmup_steps = 5;
  o.eval_batches = 4;
  Trainer trainer(o, corpus);
  trainer.start();
  const double before = trainer.evaluate_val();
  TrainObserver quiet;
  const TrainSummary s = trainer.run(quiet);
  INFO("val loss " << before << " -> " << s.val_loss);
  CHECK(before == Approx(std::log(256.0)).margin(0.1));  // uniform at init
  CHECK(s.val_loss < before - 1.5);
  CHECK(s.train_loss < before - 1.5);
}

TEST_CASE("3 steps + resume + 3 steps is bit-identical to 6 steps", "[train][resume]") {
  const TextCorpus corpus = synthetic_corpus();
  test::TempDir dir;
  TrainOptions o = tiny_options();
  o.grad_accum = 2;  // accumulation state must not leak across the resume either
  o.checkpoint_dir = (dir / "ckpt").string();

  Trainer straight(o, corpus);
  straight.start();
  std::vector<double> losses;
  for (int i = 0; i < 6; ++i) losses.push_back(straight.train_step().loss);

  {
    Trainer first(o, corpus);
    first.start();
    for (int i = 0; i < 3; ++i) REQUIRE(first.train_step().loss == losses[i]);
    first.save_checkpoint();
  }
  TrainOptions r = o;
  r.resume = o.checkpoint_dir;
  Trainer resumed(r, corpus);
  resumed.start();
  REQUIRE(resumed.step() == 3);
  for (int i = 3; i < 6; ++i) CHECK(resumed.train_step().loss == losses[i]);
  CHECK(same(resumed.model().params(), straight.model().params()));
  CHECK(same(resumed.optimizer().m(), straight.optimizer().m()));
  CHECK(same(resumed.optimizer().v(), straight.optimizer().v()));
}

TEST_CASE("gradient accumulation matches one large batch", "[train]") {
  const TextCorpus corpus = synthetic_corpus();
  TrainOptions o = tiny_options();
  o.batch_size = 8;
  TrainOptions accum = o;
  accum.grad_accum = 4;
  Trainer a(o, corpus), b(accum, corpus);
  a.start();
  b.start();
  for (int i = 0; i < 2; ++i) CHECK(a.train_step().loss == Approx(b.train_step().loss).epsilon(1e-5));
  const auto pa = a.model().params().span(), pb = b.model().params().span();
  for (std::size_t i = 0; i < pa.size(); ++i) REQUIRE(pa[i] == Approx(pb[i]).margin(1e-5));
}

TEST_CASE("the learning rate warms up linearly and decays by cosine", "[train]") {
  const LrSchedule s{1.0f, 0.1f, 10, 110};
  CHECK(s.at(0) == Approx(0.1));
  CHECK(s.at(9) == Approx(1.0));
  CHECK(s.at(10) == Approx(1.0));
  CHECK(s.at(60) == Approx(0.55));
  CHECK(s.at(110) == Approx(0.1));
  CHECK(s.at(500) == Approx(0.1));
}

TEST_CASE("clipping scales the gradients to the maximum norm", "[train]") {
  std::vector<float> g = {3.0f, 4.0f};
  const double norm = std::sqrt(grad_square_sum(g));
  CHECK(norm == 5.0);
  clip_grads(g, norm, 1.0f);
  CHECK(g[0] == Approx(0.6));
  CHECK(g[1] == Approx(0.8));
  clip_grads(g, 1.0, 2.0f);
  CHECK(g[0] == Approx(0.6));
}

// --sample prints what a byte model made: control bytes would drive the
// terminal (ESC sequences, a NUL that cut printf's text short).
TEST_CASE("a sample's bytes reach the terminal as text", "[train]") {
  using namespace std::string_literals;
  CHECK(terminal_safe("line one\n\tline two") == "line one\n\tline two");
  CHECK(terminal_safe("\x1b[2Jgone"s) == "\\x1b[2Jgone");
  CHECK(terminal_safe("a\0b\rc\x7f"s) == "a\\x00b\\x0dc\\x7f");
  CHECK(terminal_safe("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"s) == "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  CHECK(terminal_safe("\xc2\x9b" "31m"s) == "\\xc2\\x9b31m");                // C1 CSI, as UTF-8
  CHECK(terminal_safe("\x9b\xff\xc3"s) == "\\x9b\\xff\\xc3");               // stray and cut-short bytes
  CHECK(terminal_safe("\xc0\xaf\xed\xa0\x80"s) == "\\xc0\\xaf\\xed\\xa0\\x80");  // overlong, surrogate
  // A generated backslash is doubled: "\x7f" as text is not the byte 0x7f.
  CHECK(terminal_safe("a\\x7f\x7f\\"s) == "a\\\\x7f\\x7f\\\\");
}

TEST_CASE("FLOPs and memory follow the documented formulas", "[train]") {
  const TextCorpus corpus = synthetic_corpus();
  const TrainOptions o = tiny_options();
  Trainer t(o, corpus);
  const std::size_t P = t.model().table().count();
  const GptConfig& c = o.model;
  CHECK(flops_per_token(c, P) == 6.0 * (P - 16 * 16) + 12.0 * 2 * 16 * 16);
  CHECK(t.memory().peak_bytes(MemoryCategory::kParameters) == P * 4);
  CHECK(t.memory().peak_bytes(MemoryCategory::kGradients) == P * 4);
  CHECK(t.memory().peak_bytes(MemoryCategory::kOptimizerState) == 2 * P * 4);
  CHECK(t.memory().peak_bytes(MemoryCategory::kActivations) > 0);
}

}  // namespace
}  // namespace braid::trainer
