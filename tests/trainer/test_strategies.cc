// Data-parallel strategies against one process, on real forked ranks
// (DESIGN.md invariants 3, 4 and 5). One grid of runs (world sizes 1 to 4 x
// every strategy, a few steps of a tiny model with gradient accumulation,
// two gradient buckets and clipping that acts) is computed once and checked
// three ways: the losses and parameters equal the single process's to float
// tolerance (and ranks that hold the whole model hold the same one); the memory accounting follows the ZeRO table; every rank's
// bytes per step follow the theory.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>

#include "strategy_fixtures.h"
#include "trainer/train/memory_plan.h"
#include "trainer/checkpoint/checkpoint.h"
#include "tests/comm/harness.h"
#include "trainer/strategy/strategy.h"

namespace braid::trainer {
namespace {

using nlohmann::json;

const char* const kStrategies[] = {"dp", "ddp", "zero1", "zero2", "zero3"};

TrainOptions grid_options() {
  TrainOptions o;
  // Units of 50 KB (blocks) and 37 KB (embedding): DP's broadcast is above
  // the 32 KiB where it switches to the pipelined chain the theory counts;
  // the grid forces the ring all-reduce (small messages would otherwise take
  // recursive doubling, which trades bytes for latency).
  o.model = GptConfig{2, 2, 32, 16, 256};
  o.batch_size = 24;  // 24 = 1 x 2 x 12 = 2 x 2 x 6 = 3 x 2 x 4 = 4 x 2 x 3
  o.grad_accum = 2;
  o.steps = 3;
  o.lr = 1e-2f;
  o.min_lr = 1e-3f;
  o.warmup_steps = 1;
  o.grad_clip = 0.5f;   // below the norms: clipping acts on every step
  o.bucket_mb = 0.05;   // two buckets: {h.0, h.1, head} and {embedding}
  o.eval_batches = 1;
  o.seed = 21;
  return o;
}

std::vector<double> doubles(const json& j) { return j.get<std::vector<double>>(); }

// The sum of this rank's whole parameter buffer: replicas that are bit for
// bit the same give the same sum.
double replica_checksum(Trainer& t) {
  double sum = 0.0;
  for (const ParamView& v : t.model().table().views()) {
    for (std::size_t i = 0; i < v.count(); ++i) sum += t.model().params().data()[v.offset + i] * (1.0 + i % 7);
  }
  return sum;
}

struct Reference {
  std::vector<double> loss, grad_norm;
  std::vector<float> params;
};

struct Grid {
  Reference single;
  std::map<std::pair<std::string, int>, std::vector<json>> runs;  // (strategy, N) -> every rank's record
};

const Grid& grid() {
  static const Grid g = [] {
    Grid grid;
    const TextCorpus corpus = test::synthetic_corpus();
    TrainOptions o = grid_options();
    o.strategy = "none";
    Trainer single(o, corpus);
    single.start();
    for (int i = 0; i < o.steps; ++i) {
      const StepReport r = single.train_step();
      grid.single.loss.push_back(r.loss);
      grid.single.grad_norm.push_back(r.grad_norm);
    }
    grid.single.params = test::gather_params(single);
    const std::vector<float>& reference = grid.single.params;
    for (int N = 1; N <= 4; ++N) {
      for (const char* s : kStrategies) {
        o.strategy = s;
        const auto record = test::record_steps(static_cast<int>(o.steps));
        grid.runs[{s, N}] = test::run_trainers(N, o, corpus, [&](Trainer& t, json& out) {
          record(t, out);
          const std::vector<float> params = test::gather_params(t);
          double worst = 0.0;
          for (std::size_t i = 0; i < params.size(); ++i) worst = std::max(worst, double(std::abs(params[i] - reference[i])));
          out["param_diff"] = worst;
          if (t.model().params().count() > 0) out["replica"] = replica_checksum(t);
        }, "ring");
      }
    }
    return grid;
  }();
  return g;
}

TEST_CASE("invariant 3: every strategy on 1 to 4 ranks trains the single process's model", "[strategy]") {
  const Grid& g = grid();
  double worst_loss = 0.0, worst_norm = 0.0, worst_param = 0.0;
  for (const auto& [key, ranks] : g.runs) {
    INFO(key.first << " on " << key.second << " rank(s)");
    for (const json& r : ranks) {
      const double loss = test::max_abs_diff(doubles(r["loss"]), g.single.loss);
      const double norm = test::max_abs_diff(doubles(r["grad_norm"]), g.single.grad_norm);
      const double param = r["param_diff"].get<double>();
      if (r.contains("replica")) CHECK(r["replica"] == ranks[0]["replica"]);  // replicas identical
      CHECK(loss < 1e-5);
      CHECK(norm < 1e-4);
      CHECK(param < 1e-4);
      worst_loss = std::max(worst_loss, loss);
      worst_norm = std::max(worst_norm, norm);
      worst_param = std::max(worst_param, param);
    }
  }
  WARN("largest difference from one process over " << g.runs.size() << " runs: loss " << worst_loss
       << ", grad norm " << worst_norm << ", parameter " << worst_param << " (losses "
       << g.single.loss.front() << " .. " << g.single.loss.back() << ")");
}

TEST_CASE("invariant 4: ZeRO memory follows the table (N = 2, 3, 4)", "[strategy]") {
  const Grid& g = grid();
  const GptConfig c = grid_options().model;
  const double P = ParamTable::gpt(c, ModelLayout::whole(c)).param_count();
  for (int N = 2; N <= 4; ++N) {
    const ParamTable padded = ParamTable::gpt(c, ModelLayout::whole(c), N);
    const double Pp = padded.count();
    REQUIRE(Pp - P < static_cast<double>(padded.units().size() * N));  // padding: < N per unit
    for (const char* s : kStrategies) {
      const auto& ranks = g.runs.at({s, N});
      for (int rank = 0; rank < N; ++rank) {
        const json& r = ranks[rank];
        const double params = r["peak"][0], grads = r["peak"][1], optimizer = r["peak"][2];
        const std::string name = s;
        INFO(name << " on " << N << " ranks, rank " << rank << ": parameters " << params << ", gradients " << grads
                  << ", optimizer " << optimizer << " bytes; P = " << P << " (" << Pp << " padded)");
        const bool zero = name.rfind("zero", 0) == 0;
        const int stage = zero ? name.back() - '0' : 0;
        const double full = zero ? Pp : P;
        CHECK(optimizer == (name == "dp" && rank != 0 ? 0.0 : 8.0 * full / (zero ? N : 1)));
        CHECK(grads == 4.0 * full / (stage >= 2 ? N : 1));
        CHECK(params == 4.0 * full / (stage == 3 ? N : 1));
        // The memory check's estimate of ZeRO-2/3's staging holds what the
        // run staged, and not far more.
        TrainOptions o = grid_options();
        o.strategy = name;
        const double staged = r["peak"][4], estimated = memory_need(o, N).communication;
        INFO("communication buffers " << staged << " bytes, estimated " << estimated);
        if (stage >= 2) {
          CHECK(staged <= estimated);
          CHECK(estimated <= 1.5 * staged);
        }
      }
    }
  }
}

// Bytes rank r sends per step, predicted from the collectives each strategy
// issues (ring all-reduce, reduce-scatter and all-gather: (N-1)/N of their
// payload per rank; DP's chains: the payload per chain the rank does not end).
double expected_sent(const std::string& s, int N, int rank, const ParamTable& plain, const ParamTable& padded,
                     int A) {
  const double f = (N - 1.0) / N, G = 4.0 * plain.count(), Gp = 4.0 * padded.count();
  if (s == "ddp") return 2 * f * G;
  if (s == "dp") return G * ((rank != 0) + (rank != N - 1));
  if (s == "zero1") return 2 * f * Gp;
  if (s == "zero2") return (A + 1) * f * Gp;
  // zero3: two gathers of every unit and one reduce-scatter per micro-batch,
  // except that the head stays gathered from forward into backward (one
  // gather) and the embedding is gathered once more for the head's tied wte
  // (it stays gathered from one micro-batch's backward into the next's
  // forward, saving one gather per extra micro-batch).
  const double E = 4.0 * padded.units()[padded.embedding_unit()].range.count;
  const double H = 4.0 * padded.units()[padded.head_unit()].range.count;
  return f * (3 * A * Gp + E - A * H);
}

TEST_CASE("invariant 5: bytes per rank per step follow the theory", "[strategy]") {
  const Grid& g = grid();
  const TrainOptions o = grid_options();
  const ParamTable plain = ParamTable::gpt(o.model, ModelLayout::whole(o.model));
  double worst = 0.0;
  for (int N = 2; N <= 4; ++N) {
    const ParamTable padded = ParamTable::gpt(o.model, ModelLayout::whole(o.model), N);
    for (const char* s : kStrategies) {
      const auto& ranks = g.runs.at({s, N});
      for (int r = 0; r < N; ++r) {
        const double expected = expected_sent(s, N, r, plain, padded, o.grad_accum);
        for (double sent : doubles(ranks[r]["bytes_sent"])) {
          INFO(s << " on " << N << " ranks, rank " << r << ": sent " << sent << " bytes in a step, expected "
                 << expected << ", strategy's theory " << ranks[r]["theory_sent"].get<double>());
          // The slack covers the [loss, norm] sums (16 bytes per round) and
          // rounding of chunks that do not divide evenly.
          CHECK(std::abs(sent - expected) <= 0.002 * expected + 512);
          worst = std::max(worst, std::abs(sent / expected - 1.0));
        }
        const double theory = ranks[r]["theory_sent"].get<double>();
        CHECK(std::abs(theory - expected) <= 1e-6 * expected);
        const double received = doubles(ranks[r]["bytes_received"]).back();
        const double expected_received =
            s == std::string("dp") ? 4.0 * plain.count() * ((r != 1) + (r != 0)) : expected;
        CHECK(std::abs(received - expected_received) <= 0.002 * expected_received + 512);
      }
    }
  }
  WARN("largest relative difference of bytes sent per step from the prediction: " << worst);
}

TEST_CASE("a global batch that does not split across the ranks is refused", "[strategy]") {
  TrainOptions o = grid_options();
  o.batch_size = 10;
  CHECK_THROWS_WITH(validate_world(o, 4), Catch::Contains("--batch-size 10 does not split into 4 rank(s) x 2") &&
                                              Catch::Contains("multiple of 8"));
  CHECK_THROWS_WITH(validate_world(o, 4), !Catch::Contains("resumed"));
  CHECK_NOTHROW(validate_world(o, 5));
  // A resumed run took both numbers from its checkpoint: the user gave neither.
  o.resume = "ck";
  CHECK_THROWS_WITH(validate_world(o, 4), Catch::Contains("a resumed run keeps its checkpoint's --batch-size and "
                                                          "--micro-batches (--grad-accum) unless they are given"));
}

// Builds each rank's trainer with `make`, starts it and runs one step, on 3
// ranks: for the checks that refuse ranks before training.
braid::test::RunResult first_step_on_3_ranks(const std::function<Trainer(comm::Communicator&)>& make) {
  return braid::test::run_ranks(
      3,
      [&](comm::Communicator& comm) {
        Trainer trainer = make(comm);
        trainer.start();
        trainer.train_step();
      },
      braid::test::run_options(std::chrono::seconds(60), braid::test::test_config(std::chrono::seconds(20))));
}

// Every rank reads --data itself (on its own node, from its own working
// directory). Ranks that read different bytes would each sample their own
// corpus and train, silently, a model no single process trains.
TEST_CASE("ranks that read different data are refused before training", "[strategy]") {
  TrainOptions o = grid_options();
  o.strategy = "ddp";
  const TextCorpus same = test::synthetic_corpus();
  TextCorpus other = same;
  other.source = "other";
  other.bytes[100] ^= 1;  // one bit, same size
  const auto result = first_step_on_3_ranks([&](comm::Communicator& comm) {
    return Trainer(o, comm.rank() == 2 ? other : same, &comm);
  });
  INFO(result.summary());
  REQUIRE(!result.timed_out);
  for (const auto& rank : result.ranks) {
    CHECK(rank.exit_code == 1);
    CHECK_THAT(rank.message, Catch::Contains("rank 2") && Catch::Contains("same data"));
  }
}

// Each rank initialises its own weights from --seed: a node started with
// another seed (or learning rate) trained copies that never agreed, and
// the run exited 0.
TEST_CASE("ranks told other settings are refused before training, naming each difference", "[strategy]") {
  TrainOptions o = grid_options();
  o.strategy = "ddp";
  const TextCorpus corpus = test::synthetic_corpus();
  const auto result = first_step_on_3_ranks([&](comm::Communicator& comm) {
    TrainOptions mine = o;
    if (comm.rank() == 2) {
      mine.seed = 7;
      mine.lr = 0.02f;
    }
    mine.threads = 1 + comm.rank() % 2;  // may differ
    mine.metrics = "m" + std::to_string(comm.rank());
    mine.prompt = "\xe9t\xe9";  // bytes that are not UTF-8 (JSON's), alike on every rank
    return Trainer(mine, corpus, &comm);
  });
  INFO(result.summary());
  REQUIRE(!result.timed_out);
  for (const auto& rank : result.ranks) {
    CHECK(rank.exit_code == 1);
    CHECK_THAT(rank.message, Catch::Contains("rank 2 was started with other settings than rank 0: lr 0.02 (rank 0: 0.01)"));
    CHECK_THAT(rank.message, Catch::Contains("seed 7 (rank 0: " + std::to_string(o.seed) + ")"));
    CHECK_THAT(rank.message, !Catch::Contains("threads") && !Catch::Contains("metrics"));
  }
}


// The settings check sees only that --init-from or --resume was given, and
// each node may rightly read its own copy. Ranks handed files that hold
// other weights each loaded their own, averaged their gradients, and
// exited 0 (found by a review helper).
TEST_CASE("ranks that start from other weights are refused before training; copies of one file are not",
          "[strategy][checkpoint]") {
  TrainOptions o = grid_options();
  o.strategy = "zero1";
  const TextCorpus corpus = test::synthetic_corpus();
  test::TempDir dir;
  Gpt first(o.model, ModelLayout::whole(o.model), nullptr), second(o.model, ModelLayout::whole(o.model), nullptr);
  test::randomize(first, 1);
  test::randomize(second, 2);
  save_weights(dir / "a.safetensors", first, 0);
  save_weights(dir / "b.safetensors", second, 0);
  std::filesystem::copy_file(dir / "a.safetensors", dir / "copy_of_a.safetensors");
  auto run = [&](const std::string& rank_2_file) {
    return first_step_on_3_ranks([&](comm::Communicator& comm) {
      TrainOptions mine = o;
      mine.init_from = (dir / (comm.rank() == 2 ? rank_2_file : "a.safetensors")).string();
      return Trainer(mine, corpus, &comm);
    });
  };

  const auto copies = run("copy_of_a.safetensors");
  INFO(copies.summary());
  REQUIRE(!copies.timed_out);
  for (const auto& rank : copies.ranks) CHECK(rank.exit_code == 0);

  const auto other = run("b.safetensors");
  INFO(other.summary());
  REQUIRE(!other.timed_out);
  for (const auto& rank : other.ranks) {
    CHECK(rank.exit_code == 1);
    CHECK_THAT(rank.message, Catch::Contains("rank 2 read another --init-from than rank 0"));
  }
}

}  // namespace
}  // namespace braid::trainer
