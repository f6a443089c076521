// The mesh in the Trainer (DESIGN.md invariant 3 for TP, PP and their
// composition with DP): every layout trains the single process's model
// (losses, gradient norms and parameters to float tolerance over three
// steps with clipping that acts); a checkpoint of a tp 2 x pp 2 run
// consolidates into one file that loads at dp 4, tp 4 and on one process, and
// resumes on one process where the single run goes on; bad combinations are
// refused before any work, saying what to change.
#include <catch2/catch.hpp>

#include <map>

#include "runtime/errors.h"
#include "strategy_fixtures.h"
#include "trainer/checkpoint/sharded.h"
#include "trainer/strategy/mesh.h"

namespace braid::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Tensors = std::map<std::string, std::vector<float>>;

TrainOptions mesh_options() {
  TrainOptions o;
  o.model = GptConfig{4, 4, 32, 16, 256};
  o.batch_size = 8;  // dp 2 x 2 micro-batches x 2 sequences
  o.grad_accum = 2;
  o.steps = 3;
  o.lr = 1e-2f;
  o.min_lr = 1e-3f;
  o.warmup_steps = 1;
  o.grad_clip = 0.5f;  // below the norms: clipping acts
  o.bucket_mb = 0.02;  // several buckets
  o.eval_batches = 1;
  o.seed = 33;
  return o;
}

struct Layout {
  int dp, tp, pp;
  const char* schedule;
  const char* strategy;  // "": the default, none on one DP rank
};

// Every whole tensor this rank's stage holds, by name (collective).
Tensors stage_tensors(Trainer& t) {
  Tensors tensors;
  for (const ParamView& v : t.model().table().views()) {
    tensors[v.name] = t.mesh() != nullptr ? t.mesh()->read_whole(Slot::kParams, v)
                                          : t.strategy().read_view(Slot::kParams, v);
  }
  return tensors;
}

double max_diff(const Tensors& got, const Tensors& want) {
  double worst = 0.0;
  for (const auto& [name, values] : got) {
    const std::vector<float>& w = want.at(name);
    REQUIRE(w.size() == values.size());
    for (std::size_t i = 0; i < w.size(); ++i) worst = std::max(worst, double(std::abs(values[i] - w[i])));
  }
  return worst;
}

struct Single {
  std::vector<double> loss, grad_norm;
  Tensors params;
  double val_loss = 0.0;
};

const Single& single_run() {
  static const Single s = [] {
    Single s;
    TrainOptions o = mesh_options();
    o.strategy = "none";
    const TextCorpus corpus = test::synthetic_corpus();
    Trainer t(o, corpus);
    t.start();
    for (int i = 0; i < o.steps; ++i) {
      const StepReport r = t.train_step();
      s.loss.push_back(r.loss);
      s.grad_norm.push_back(r.grad_norm);
    }
    s.params = stage_tensors(t);
    s.val_loss = t.evaluate_val();
    return s;
  }();
  return s;
}

TEST_CASE("invariant 3: tp, pp and their meshes with dp train the single process's model", "[mesh]") {
  const Single& single = single_run();
  const Layout layouts[] = {
      {1, 2, 1, "1f1b", ""},  {1, 4, 1, "1f1b", ""}, {1, 1, 2, "gpipe", ""}, {1, 1, 2, "1f1b", ""},
      {1, 1, 4, "gpipe", ""}, {1, 1, 4, "1f1b", ""}, {2, 2, 1, "1f1b", "ddp"},   {2, 1, 2, "1f1b", "ddp"},
      {2, 1, 2, "gpipe", "zero1"}, {1, 2, 2, "1f1b", ""}, {2, 2, 2, "1f1b", "ddp"},  {2, 2, 2, "gpipe", "zero1"},
  };
  const TextCorpus corpus = test::synthetic_corpus();
  double worst_loss = 0.0, worst_norm = 0.0, worst_param = 0.0;
  for (const Layout& l : layouts) {
    TrainOptions o = mesh_options();
    o.dp = l.dp, o.tp = l.tp, o.pp = l.pp, o.schedule = l.schedule, o.strategy = l.strategy;
    const auto ranks = test::run_trainers(l.dp * l.tp * l.pp, o, corpus, [&](Trainer& t, json& out) {
      test::record_steps(static_cast<int>(o.steps))(t, out);
      out["param_diff"] = max_diff(stage_tensors(t), single.params);
      out["val_loss"] = t.evaluate_val();
    });
    INFO("dp " << l.dp << " x tp " << l.tp << " x pp " << l.pp << ", " << l.schedule << ", " << (*l.strategy ? l.strategy : "none"));
    for (const json& r : ranks) {
      const double loss = test::max_abs_diff(r["loss"].get<std::vector<double>>(), single.loss);
      const double norm = test::max_abs_diff(r["grad_norm"].get<std::vector<double>>(), single.grad_norm);
      const double param = r["param_diff"].get<double>();
      CHECK(loss < 1e-5);
      CHECK(norm < 1e-4);
      CHECK(param < 1e-4);
      CHECK(std::abs(r["val_loss"].get<double>() - single.val_loss) < 1e-4);
      worst_loss = std::max(worst_loss, loss);
      worst_norm = std::max(worst_norm, norm);
      worst_param = std::max(worst_param, param);
    }
  }
  WARN("largest difference from one process over " << std::size(layouts) << " layouts: loss " << worst_loss
       << ", grad norm " << worst_norm << ", parameter " << worst_param);
}

// The pipeline's evaluation holds at most 64 micro-batches at once (more
// with --grad-accum), whatever --eval-batches: it held them all, so a large
// count failed with std::bad_alloc before the first step.
TEST_CASE("the pipeline evaluates in groups of micro-batches: 130 give the single process's val loss, 10^8 fit",
          "[mesh]") {
  const TextCorpus corpus = test::synthetic_corpus();
  TrainOptions o = mesh_options();
  o.eval_batches = 130;  // groups of 64, 64 and 2
  o.strategy = "none";
  Trainer single(o, corpus);
  single.start();
  const double want = single.evaluate_val();
  o.strategy = "";
  o.pp = 2;
  for (const json& r : test::run_trainers(2, o, corpus, [](Trainer& t, json& out) { out["val"] = t.evaluate_val(); }))
    CHECK(std::abs(r["val"].get<double>() - want) < 1e-5);
  o.eval_batches = 100'000'000;  // 10^8 x 4 sequences x 16 tokens x 2 x 4 bytes: 51 GB at once
  for (const json& r : test::run_trainers(2, o, corpus, [](Trainer& t, json& out) { out["steps"] = t.train_step().loss; }))
    CHECK(r.contains("steps"));
}

// The validation loss of the same weights is one number whatever the
// layout: evaluation took one micro-batch of each batch, so it moved with
// --grad-accum and with a pipeline's --micro-batches.
TEST_CASE("the val loss of the same weights does not move with --grad-accum, --micro-batches or dp", "[mesh]") {
  const TextCorpus corpus = test::synthetic_corpus();
  TrainOptions o = mesh_options();
  o.eval_batches = 2;
  o.strategy = "none";
  o.grad_accum = 1;
  Trainer whole(o, corpus);
  whole.start();
  const double want = whole.evaluate_val();
  for (int accum : {2, 4, 8}) {
    o.grad_accum = accum;
    Trainer t(o, corpus);
    t.start();
    CHECK(std::abs(t.evaluate_val() - want) < 1e-6);
  }
  o.strategy = "";
  o.pp = 2;
  o.grad_accum = 4;
  for (const json& r : test::run_trainers(2, o, corpus, [](Trainer& t, json& out) { out["val"] = t.evaluate_val(); }))
    CHECK(std::abs(r["val"].get<double>() - want) < 1e-5);
  o.pp = 1;
  o.strategy = "ddp";
  o.grad_accum = 2;
  for (const json& r : test::run_trainers(2, o, corpus, [](Trainer& t, json& out) { out["val"] = t.evaluate_val(); }))
    CHECK(std::abs(r["val"].get<double>() - want) < 1e-5);
}

TEST_CASE("a tp 2 x pp 2 checkpoint consolidates, loads at dp 4, tp 4 and on one process, and resumes", "[mesh][checkpoint]") {
  test::TempDir dir;
  const TextCorpus corpus = test::synthetic_corpus();
  TrainOptions o = mesh_options();
  o.steps = 2;
  o.tp = 2, o.pp = 2;
  o.checkpoint_dir = (dir / "ck").string();
  // Two steps and a checkpoint; the stages' parameters recorded whole.
  const auto saved = test::run_trainers(4, o, corpus, [](Trainer& t, json& out) {
    for (int i = 0; i < 2; ++i) t.train_step();
    t.save_checkpoint();
    for (const auto& [name, values] : stage_tensors(t)) out["params"][name] = values;
  });
  Tensors mesh_params;
  for (const json& r : saved) {
    for (const auto& [name, values] : r["params"].items()) mesh_params[name] = values.get<std::vector<float>>();
  }
  const fs::path file = dir / "weights.safetensors";
  REQUIRE(consolidate_checkpoint(dir / "ck", file) == 2);

  TrainOptions load = mesh_options();
  load.init_from = file.string();
  load.strategy = "ddp";
  const auto dp4 = test::run_trainers(4, load, corpus, [&](Trainer& t, json& out) {
    out["param_diff"] = max_diff(stage_tensors(t), mesh_params);
  });
  for (const json& r : dp4) CHECK(r["param_diff"].get<double>() == 0.0);
  load.strategy = "";
  load.tp = 4;
  const auto tp4 = test::run_trainers(4, load, corpus, [&](Trainer& t, json& out) {
    out["param_diff"] = max_diff(stage_tensors(t), mesh_params);
  });
  for (const json& r : tp4) CHECK(r["param_diff"].get<double>() == 0.0);
  load.tp = 1;

  load.strategy = "none";
  Trainer one(load, corpus);
  one.start();
  CHECK(max_diff(stage_tensors(one), mesh_params) == 0.0);

  // The optimizer state too: one process resumes at step 2 and its step 3
  // is the single run's.
  TrainOptions resume = mesh_options();
  resume.strategy = "none";
  resume.resume = (dir / "ck").string();
  Trainer resumed(resume, corpus);
  resumed.start();
  REQUIRE(resumed.step() == 2);
  CHECK(std::abs(resumed.train_step().loss - single_run().loss[2]) < 1e-5);
}

TEST_CASE("bad mesh combinations are refused before any work, saying what to change", "[mesh]") {
  const GptConfig c{4, 4, 32, 16, 256};
  CHECK_THROWS_WITH(validate_mesh(c, {1, 3, 1}, StrategyKind::kNone, 3), Catch::Contains("heads"));
  CHECK_THROWS_WITH(validate_mesh(c, {1, 1, 8}, StrategyKind::kNone, 8), Catch::Contains("n_layer"));
  CHECK_THROWS_WITH(validate_mesh(c, {2, 2, 1}, StrategyKind::kDdp, 8), Catch::Contains("dp 2 x tp 2 x pp 1"));
  CHECK_THROWS_WITH(validate_mesh(c, {2, 1, 2}, StrategyKind::kZero2, 4), Catch::Contains("use --strategy ddp or zero1"));
  CHECK_THROWS_WITH(validate_mesh(c, {1, 2, 1}, StrategyKind::kZero3, 2), Catch::Contains("zero3"));
  // none at dp 2: its own reason (it gave zero2's and zero3's).
  CHECK_THROWS_WITH(validate_mesh(c, {2, 2, 1}, StrategyKind::kNone, 4),
                    Catch::Contains("--strategy none") && Catch::Contains("only at dp 1") &&
                        !Catch::Contains("zero3"));
  validate_mesh(c, {1, 2, 2}, StrategyKind::kNone, 4);
  validate_mesh(c, {2, 2, 2}, StrategyKind::kZero1, 8);

  TrainOptions o = mesh_options();
  o.tp = 2, o.pp = 2;
  CHECK_THROWS_WITH(validate_world(o, 6), Catch::Contains("is not the world of 6"));
  o.batch_size = 6;  // dp 2 x 2 micro-batches does not divide it
  CHECK_THROWS_WITH(validate_world(o, 8), Catch::Contains("--batch-size 6"));
  o.batch_size = 8;
  validate_world(o, 8);
  o.sample_bytes = 10;
  CHECK_THROWS_AS(validate(o), InvalidUsage);
}

}  // namespace
}  // namespace braid::trainer
