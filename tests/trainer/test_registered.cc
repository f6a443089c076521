// Registered communication buffers (issue 14, trainer/strategy/comm_memory.h).
// On one host over shm, DDP's gradient buffer comes from
// Communicator::allocate and every bucket's all-reduce runs the direct
// algorithm; the same run over TCP (no shm, so nothing registered) is the
// unregistered path, and both train the same model. Every strategy's memory
// accounting is the same either way; with "direct" forced, ZeRO's
// reduce-scatters and all-gathers run directly on its registered buffers. When a registered allocation fails on
// one rank, every rank goes back to ordinary memory, contents kept.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "runtime/errors.h"
#include "strategy_fixtures.h"
#include "tests/comm/harness.h"
#include "trainer/strategy/comm_memory.h"
#include "trainer/strategy/ddp.h"

namespace braid::trainer {
namespace {

using nlohmann::json;

TrainOptions registered_options() {
  TrainOptions o;
  // Every unit holds at least 64 KiB of gradients (the embedding 256 x 64 +
  // 16 x 64 floats, a block about 12 x 64 x 64), so every bucket is at or
  // above the direct all-reduce's threshold.
  o.model = GptConfig{2, 2, 64, 16, 256};
  o.batch_size = 8;  // 2 ranks x 2 micro-batches x 2 = 4 x 2 x 1
  o.grad_accum = 2;
  o.steps = 3;
  o.lr = 1e-2f;
  o.min_lr = 1e-3f;
  o.warmup_steps = 1;
  o.grad_clip = 0.5f;
  o.bucket_mb = 0.25;  // three buckets: each block (with the head), the embedding
  o.eval_batches = 1;
  o.seed = 17;
  return o;
}

std::vector<double> doubles(const json& j) { return j.get<std::vector<double>>(); }

// Steps, then what the strategy says of its buffers; rank 0 adds the
// parameters.
test::RankBody registered_body(int steps) {
  return [steps](Trainer& t, json& out) {
    test::record_steps(steps)(t, out);
    out["registered"] = t.strategy().buffers_registered();
    if (auto* ddp = dynamic_cast<DdpStrategy*>(&t.strategy())) {
      out["algorithm"] = ddp->bucket_algorithm().name;
      out["reason"] = ddp->bucket_algorithm().reason;
    }
    const std::vector<float> params = test::gather_params(t);
    if (t.strategy().rank() == 0) out["params"] = params;
  };
}

double max_param_diff(const json& a, const json& b) {
  const auto x = a["params"].get<std::vector<double>>(), y = b["params"].get<std::vector<double>>();
  return test::max_abs_diff(x, y);
}

TEST_CASE("ddp on one host all-reduces every gradient bucket directly in registered memory", "[strategy]") {
  const TextCorpus corpus = test::synthetic_corpus();
  TrainOptions o = registered_options();
  o.strategy = "ddp";
  for (int N : {2, 4}) {
    const auto shm = test::run_trainers(N, o, corpus, registered_body(3), "auto", "auto");
    const auto tcp = test::run_trainers(N, o, corpus, registered_body(3), "auto", "tcp");
    for (int r = 0; r < N; ++r) {
      INFO("ddp on " << N << " ranks, rank " << r << ": over shm " << shm[r]["algorithm"] << " ("
                     << shm[r]["reason"] << "), over tcp " << tcp[r]["algorithm"]);
      CHECK(shm[r]["registered"] == true);
      CHECK(shm[r]["algorithm"] == "direct");
      CHECK(tcp[r]["registered"] == false);
      CHECK(tcp[r]["algorithm"] != "direct");
      // Direct moves no gradient through the transport, only references
      // and tokens (under a hundred bytes per peer and bucket): a single
      // bucket on the ring would send at least (N-1)/N of its 64 KiB.
      const double theory = shm[r]["theory_sent"].get<double>();
      for (double sent : doubles(shm[r]["bytes_sent"])) CHECK(sent < 4096);
      for (double sent : doubles(tcp[r]["bytes_sent"])) CHECK(sent > 0.9 * theory);
      // The unregistered path trains the same model.
      CHECK(test::max_abs_diff(doubles(shm[r]["loss"]), doubles(tcp[r]["loss"])) < 1e-5);
      CHECK(test::max_abs_diff(doubles(shm[r]["grad_norm"]), doubles(tcp[r]["grad_norm"])) < 1e-4);
    }
    CHECK(max_param_diff(shm[0], tcp[0]) < 1e-4);
  }
}

TEST_CASE("registered buffers leave every strategy's losses and memory accounting as they were", "[strategy]") {
  const TextCorpus corpus = test::synthetic_corpus();
  TrainOptions o = registered_options();
  for (const char* s : {"ddp", "zero1", "zero2", "zero3"}) {
    o.strategy = s;
    const auto shm = test::run_trainers(2, o, corpus, registered_body(2), "auto", "auto");
    const auto tcp = test::run_trainers(2, o, corpus, registered_body(2), "auto", "tcp");
    for (int r = 0; r < 2; ++r) {
      INFO(s << " on 2 ranks, rank " << r);
      CHECK(shm[r]["registered"] == true);
      CHECK(tcp[r]["registered"] == false);
      // Each category's peak, to the byte, but communication buffers: how
      // many staging buffers ZeRO-2/3 hold at once depends on whether a
      // reduce-scatter has already completed when the next bucket opens.
      for (MemoryCategory c : {MemoryCategory::kParameters, MemoryCategory::kGradients,
                               MemoryCategory::kOptimizerState, MemoryCategory::kActivations}) {
        const auto i = static_cast<std::size_t>(c);
        INFO(category_name(c));
        CHECK(shm[r]["peak"][i] == tcp[r]["peak"][i]);
      }
      CHECK(test::max_abs_diff(doubles(shm[r]["loss"]), doubles(tcp[r]["loss"])) < 1e-5);
    }
    CHECK(max_param_diff(shm[0], tcp[0]) < 1e-4);
  }
}

TEST_CASE("zero's registered buffers run every collective directly when direct is forced", "[strategy]") {
  // select.cc runs host reduce_scatter and all_gather directly only when
  // the config forces "direct"; they then need every buffer registered.
  const TextCorpus corpus = test::synthetic_corpus();
  TrainOptions o = registered_options();
  for (const char* s : {"zero1", "zero2", "zero3"}) {
    o.strategy = s;
    const auto direct = test::run_trainers(2, o, corpus, registered_body(2), "direct", "auto");
    const auto tcp = test::run_trainers(2, o, corpus, registered_body(2), "auto", "tcp");
    for (int r = 0; r < 2; ++r) {
      INFO(s << " on 2 ranks, rank " << r);
      CHECK(direct[r]["registered"] == true);
      // References and tokens only: one ring reduce-scatter of the
      // smallest group would send more.
      for (double sent : doubles(direct[r]["bytes_sent"])) CHECK(sent < 8192);
      CHECK(test::max_abs_diff(doubles(direct[r]["loss"]), doubles(tcp[r]["loss"])) < 1e-5);
    }
    CHECK(max_param_diff(direct[0], tcp[0]) < 1e-4);
  }
}

// RegisteredMemory for the tests: malloc'd, counted, or always failing.
int live_test_allocations = 0;
void* test_allocate(std::size_t bytes) {
  ++live_test_allocations;
  return std::calloc(1, bytes);
}
void test_deallocate(void* p) {
  --live_test_allocations;
  std::free(p);
}
void* failing_allocate(std::size_t bytes) {
  throw SystemError("test: no registered memory for " + std::to_string(bytes) + " bytes");
}
constexpr RegisteredMemory kTestMemory{&test_allocate, &test_deallocate};
constexpr RegisteredMemory kFailingMemory{&failing_allocate, &test_deallocate};

TEST_CASE("a registered FlatBuffer is charged its floats and moves with its contents", "[strategy]") {
  MemoryAccount account;
  {
    FlatBuffer b(1000, MemoryCategory::kGradients, &account, kTestMemory);
    CHECK(b.registered());
    CHECK(live_test_allocations == 1);
    CHECK(account.current_bytes(MemoryCategory::kGradients) == 4000);
    CHECK(b.span()[999] == 0.0f);
    b.span()[7] = 3.5f;
    b.move_to_backend();
    CHECK_FALSE(b.registered());
    CHECK(live_test_allocations == 0);
    CHECK(b.span()[7] == 3.5f);
    CHECK(account.current_bytes(MemoryCategory::kGradients) == 4000);
    CHECK(account.peak_bytes(MemoryCategory::kGradients) == 4000);
  }
  CHECK(live_test_allocations == 0);
  CHECK(account.current_bytes(MemoryCategory::kGradients) == 0);
}

// `ranks` ranks each allocate a buffer through CommMemory and agree on it;
// rank `failing` (none when negative) cannot allocate registered memory.
// A rank that sees something wrong fails with what it saw.
braid::test::RunResult agree_with_failing_rank(int ranks, int failing) {
  return braid::test::run_ranks(
      ranks,
      [failing](comm::Communicator& comm) {
        using braid::test::expect;
        const bool fails = comm.rank() == failing;
        CommMemory memory(&comm, Device::kCpu, fails ? kFailingMemory : kTestMemory);
        expect(memory.registers(), "ranks over shm should register");
        MemoryAccount account;
        FlatBuffer b = memory.allocate(5000, MemoryCategory::kGradients, &account);
        expect(b.registered() != fails, "the allocation should fall back on the failing rank only");
        b.span()[4999] = static_cast<float>(comm.rank() + 1);
        const bool kept = memory.agree({&b});
        expect(kept == (failing < 0), "agree() should keep registration only when no rank failed");
        expect(b.registered() == kept && memory.registers() == kept, "buffers should follow the agreement");
        expect(b.span()[4999] == static_cast<float>(comm.rank() + 1), "contents lost by the move");
        expect(account.current_bytes(MemoryCategory::kGradients) == 20000, "charge changed by the move");
      },
      braid::test::run_options(std::chrono::seconds(60), braid::test::test_config(std::chrono::seconds(20))));
}

TEST_CASE("a registered allocation that fails on one rank takes every rank to ordinary memory", "[strategy]") {
  for (int failing : {-1, 0, 2}) {
    const auto result = agree_with_failing_rank(3, failing);
    INFO("failing rank " << failing << ":\n" << result.summary());
    CHECK(result.all_ok());
  }
}

TEST_CASE("nothing registers over tcp, without a communicator or on the GPU", "[strategy]") {
  runtime::Config config = braid::test::test_config(std::chrono::seconds(20));
  config.transport = "tcp";
  const auto result = braid::test::run_ranks(
      2,
      [](comm::Communicator& comm) {
        braid::test::expect(!CommMemory(&comm, Device::kCpu).registers(), "tcp peers cannot map registered memory");
        braid::test::expect(!CommMemory(&comm, Device::kCuda).registers(), "device buffers are not host memory");
      },
      braid::test::run_options(std::chrono::seconds(60), config));
  INFO(result.summary());
  CHECK(result.all_ok());
  CHECK_FALSE(CommMemory(nullptr, Device::kCpu).registers());
}

}  // namespace
}  // namespace braid::trainer
