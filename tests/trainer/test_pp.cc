// Pipeline parallelism on forked ranks: pp 2 and pp 4 with GPipe and 1F1B
// give the loss and the gradients of one process on the same micro-batches;
// 1F1B bounds the activations in flight where GPipe holds all M; and TP x PP
// composed over the mesh's groups still matches.
//
// The ranks run over shared memory with a 4 KiB ring and send 8 KiB
// activations, so every send waits for the matching receive: an order of
// sends and receives that could deadlock does, and fails the test at the
// communicator's timeout.
#include <catch2/catch.hpp>

#include <fstream>

#include <nlohmann/json.hpp>

#include "model_fixtures.h"
#include "parallel_fixtures.h"
#include "runtime/errors.h"
#include "trainer/strategy/pp_schedule.h"
#include "trainer/strategy/process_groups.h"
#include "trainer/strategy/tp_comm.h"

namespace braid::trainer {
namespace {

using braid::test::expect;
using nlohmann::json;
using test::expect_close;

const GptConfig kConfig{4, 2, 32, 32, 256};
constexpr int kB = 2, kT = 32, kN = kB * kT;

struct PpCase {
  PpSchedule schedule;
  int micro_batches;
};

// Every micro-batch's tokens and targets, the same on every rank.
struct Batches {
  explicit Batches(int M) {
    for (int i = 0; i < M; ++i) {
      tokens.push_back(test::random_ints(kN, 100 + i));
      targets.push_back(test::random_ints(kN, 200 + i));
    }
    for (int i = 0; i < M; ++i) micro_batches.push_back({tokens[i].data(), targets[i].data(), kB, kT});
  }
  std::vector<std::vector<std::int32_t>> tokens, targets;
  std::vector<MicroBatch> micro_batches;
};

// One process runs the micro-batches one after the other; returns the loss sum.
double run_whole(Gpt& whole, const Batches& batches, float dloss) {
  whole.zero_grads();
  Activations acts = whole.make_activations(kB, kT);
  double loss_sum = 0.0;
  for (const MicroBatch& mb : batches.micro_batches) {
    loss_sum += static_cast<double>(whole.forward(acts, mb.tokens, mb.targets)) * kN;
    whole.backward(acts, dloss);
  }
  return loss_sum;
}

// One step of `schedule` on this rank's stage, the tied embedding summed.
// Each micro-batch goes forward, then backward, once, in order.
PipelineStats run_stage(PpSchedule schedule, Gpt& model, PipeComm& pipe, ActivationPool& pool,
                        const Batches& batches, float dloss) {
  model.zero_grads();
  std::vector<int> forwards, backwards, expected(batches.micro_batches.size());
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<int>(i);
  PipelineCallbacks callbacks{[&](int i) { forwards.push_back(i); }, [&](int i) { backwards.push_back(i); }};
  PipelineStats stats = run_pp_schedule(schedule, model, pipe, pool, batches.micro_batches, dloss, callbacks);
  expect(forwards == expected && backwards == expected, "micro-batches ran out of order or not once each");
  expect(pool.in_flight() == 0, "the schedule kept activations after the step");
  const bool holds_wte = model.table().contains("wte.weight");
  float* wte = holds_wte ? model.grads().data() + model.table().find("wte.weight").offset : nullptr;
  pipe.sum_tied_embedding_grads(wte, static_cast<std::size_t>(kConfig.vocab_size) * kConfig.n_embd);
  return stats;
}

// This rank's loss (last stage) and gradients, gathered over its TP group,
// against the whole model's.
void expect_matches_whole(const std::string& what, Gpt& model, comm::Communicator& tp, const PipelineStats& stats,
                          const Gpt& whole, double whole_loss_sum) {
  if (model.layout().pp_is_last_stage) expect_close(what + ": loss sum", stats.loss_sum, whole_loss_sum);
  for (const ParamView& v : model.table().views()) {
    const std::vector<float> grad = tp_gather_tensor(tp, v, model.grads().data() + v.offset);
    const ParamView& w = whole.table().find(v.name);
    expect_close(what + ": " + v.name + " gradient", grad.data(), whole.grads().data() + w.offset, w.count());
  }
}

json stats_json(const PpCase& c, const PipelineStats& s) {
  return {{"schedule", std::string(pp_schedule_name(c.schedule))},
          {"micro_batches", c.micro_batches},
          {"peak_in_flight", s.peak_in_flight},
          {"peak_activation_bytes", s.peak_activation_bytes},
          {"bubble", s.bubble_fraction()},
          {"busy_s", s.busy.count()},
          {"idle_s", s.idle.count()}};
}

// Every case on this rank's stage of a pure pipeline (the world is the PP group).
void pp_matches_whole(comm::Communicator& world, const std::vector<PpCase>& cases, const std::string& out_path) {
  Gpt whole(kConfig, ModelLayout::whole(kConfig), nullptr);
  test::randomize(whole, 5);
  const MeshShape shape{1, 1, world.size()};
  Gpt model(kConfig, mesh_model_layout(kConfig, shape, mesh_coord(shape, world.rank())), nullptr);
  test::copy_from_whole(whole, model);
  PipeComm pipe(world);
  ActivationPool pool(model, kB, kT);
  std::unique_ptr<comm::Communicator> alone = world.split(world.rank(), 0);  // a TP group of one
  json out = json::array();
  for (const PpCase& c : cases) {
    const Batches batches(c.micro_batches);
    const float dloss = 1.0f / (c.micro_batches * kN);
    const double whole_loss = run_whole(whole, batches, dloss);
    const PipelineStats stats = run_stage(c.schedule, model, pipe, pool, batches, dloss);
    const std::string what = std::string(pp_schedule_name(c.schedule)) + " M " + std::to_string(c.micro_batches);
    expect_matches_whole(what, model, *alone, stats, whole, whole_loss);
    out.push_back(stats_json(c, stats));
    const PipelineStats eval = pp_forward_only(model, pipe, pool, batches.micro_batches);
    if (pipe.is_last_stage()) expect_close(what + ": forward-only loss sum", eval.loss_sum, whole_loss);
    expect(eval.peak_in_flight == 1, "forward-only held " + std::to_string(eval.peak_in_flight) + " micro-batches");
  }
  std::ofstream(out_path) << out.dump();
}

TEST_CASE("pp: gpipe and 1f1b over 2 and 4 stages match one process", "[pp]") {
  const int P = GENERATE(2, 4);
  const std::vector<PpCase> cases = {{PpSchedule::kGpipe, 6}, {PpSchedule::k1f1b, 6},
                                     {PpSchedule::k1f1b, P - 1}, {PpSchedule::kGpipe, 1}, {PpSchedule::k1f1b, 1}};
  test::TempDir dir;
  const auto result = braid::test::run_ranks(P, [&](comm::Communicator& world) {
    pp_matches_whole(world, cases, (dir / ("rank_" + std::to_string(world.rank()) + ".json")).string());
  }, test::rendezvous_run_options());
  INFO(P << " stages:\n" << result.summary());
  REQUIRE(result.all_ok());

  for (int s = 0; s < P; ++s) {
    const json stages = json::parse(std::ifstream(dir / ("rank_" + std::to_string(s) + ".json")));
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const json& st = stages[i];
      const int M = cases[i].micro_batches, peak = st["peak_in_flight"];
      INFO("stage " << s << " of " << P << ", " << st.dump());
      const bool gpipe = cases[i].schedule == PpSchedule::kGpipe;
      // GPipe holds every micro-batch; 1F1B as many as stage s has forwards
      // in flight, P-s (stages after the first held one more, P-s+1).
      if (gpipe) CHECK(peak == M);
      if (!gpipe) CHECK(peak == std::min(P - s, M));
      CHECK(st["peak_activation_bytes"].get<std::size_t>() % peak == 0);
      // The window spans the fill and the flush: every stage waits for the others some of it.
      CHECK(st["bubble"].get<double>() > 0.0);
      CHECK(st["bubble"].get<double>() < 1.0);
    }
  }
}

// World 4 = tp 2 x pp 2: each stage is cut over its TP group, activations
// flow over the PP groups, 1F1B over 4 micro-batches.
void tp_pp_matches_whole(comm::Communicator& world) {
  const MeshShape shape{1, 2, 2};
  ProcessGroups groups = ProcessGroups::build(world, shape);
  Gpt whole(kConfig, ModelLayout::whole(kConfig), nullptr);
  test::randomize(whole, 6);
  Gpt model(kConfig, mesh_model_layout(kConfig, shape, groups.coord), nullptr);
  test::copy_from_whole(whole, model);
  TpHooks hooks(*groups.tp_group);
  model.set_hooks(&hooks);
  PipeComm pipe(*groups.pp_group);
  ActivationPool pool(model, kB, kT);
  const int M = 4;
  const Batches batches(M);
  const float dloss = 1.0f / (M * kN);
  const double whole_loss = run_whole(whole, batches, dloss);
  const PipelineStats stats = run_stage(PpSchedule::k1f1b, model, pipe, pool, batches, dloss);
  expect_matches_whole("tp 2 x pp 2", model, *groups.tp_group, stats, whole, whole_loss);
}

TEST_CASE("pp: tp 2 x pp 2 over the mesh's groups matches one process", "[pp][tp][mesh]") {
  const auto result = braid::test::run_ranks(4, tp_pp_matches_whole, test::rendezvous_run_options());
  INFO(result.summary());
  REQUIRE(result.all_ok());
}

TEST_CASE("pp: theory and schedule names", "[pp]") {
  CHECK(pp_bubble_theory(1, 8) == 0.0);
  CHECK(pp_bubble_theory(4, 4) == Approx(3.0 / 7.0));
  CHECK(parse_pp_schedule("1f1b") == PpSchedule::k1f1b);
  CHECK(parse_pp_schedule(pp_schedule_name(PpSchedule::kGpipe)) == PpSchedule::kGpipe);
  CHECK_THROWS_AS(parse_pp_schedule("interleaved"), InvalidUsage);
}

}  // namespace
}  // namespace braid::trainer
