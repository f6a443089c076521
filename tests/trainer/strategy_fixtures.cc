#include "strategy_fixtures.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>

#include "tests/comm/harness.h"

namespace braid::trainer::test {

using nlohmann::json;

std::vector<json> run_trainers(int ranks, const TrainOptions& options, const TextCorpus& corpus,
                               const RankBody& body, const std::string& algo, const std::string& transport) {
  TempDir dir;
  braid::test::RunOptions run_options;
  run_options.deadline = std::chrono::seconds(90);
  run_options.config = braid::test::test_config(std::chrono::seconds(30));
  run_options.config.algo = algo;
  run_options.config.transport = transport;
  const auto result = braid::test::run_ranks(
      ranks,
      [&](comm::Communicator& comm) {
        Trainer trainer(options, corpus, options.strategy == "none" ? nullptr : &comm);
        trainer.start();
        json out;
        body(trainer, out);
        std::ofstream(dir / ("rank_" + std::to_string(comm.rank()) + ".json")) << out.dump();
      },
      run_options);
  INFO("strategy " << options.strategy << " on " << ranks << " rank(s):\n" << result.summary());
  REQUIRE(result.all_ok());
  std::vector<json> outs;
  for (int r = 0; r < ranks; ++r) outs.push_back(json::parse(std::ifstream(dir / ("rank_" + std::to_string(r) + ".json"))));
  return outs;
}

RankBody record_steps(int steps) {
  return [steps](Trainer& trainer, json& out) {
    for (int i = 0; i < steps; ++i) {
      const StepReport r = trainer.train_step();
      out["loss"].push_back(r.loss);
      out["grad_norm"].push_back(r.grad_norm);
      out["bytes_sent"].push_back(r.bytes_sent);
      out["bytes_received"].push_back(r.bytes_received);
      out["theory_sent"] = r.theory.sent;
      out["theory_received"] = r.theory.received;
    }
    for (std::size_t c = 0; c < kMemoryCategoryCount; ++c) {
      out["peak"].push_back(trainer.memory().peak_bytes(static_cast<MemoryCategory>(c)));
    }
  };
}

std::vector<float> gather_params(Trainer& trainer) {
  std::vector<float> all;
  for (const ParamView& v : trainer.model().table().views()) {
    const std::vector<float> values = trainer.strategy().read_view(Slot::kParams, v);
    all.insert(all.end(), values.begin(), values.end());
  }
  return all;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

}  // namespace braid::trainer::test
