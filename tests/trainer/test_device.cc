// The trainer on a CUDA device (--device cuda) against the same run on the
// CPU: every strategy and the mesh, on forked ranks sharing the machine's
// GPU(s), must give the CPU's losses, gradient norms and parameters to float
// tolerance (the kernels sum in other orders and use the device's expf and
// tanhf, so bit equality is not expected); a checkpoint written from device
// memory must hold exactly the device's parameters.
//
// Needs a GPU: without one (this project's CI) the equivalence cases say so
// and pass as skipped, and the refusal of --device cuda is checked instead.
// CUDA is touched only in forked processes (ranks and a probe), never in the
// test process, so the ranks may initialise it.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "runtime/errors.h"
#include "strategy_fixtures.h"
#include "trainer/model/backend.h"

namespace braid::trainer {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Whether a fresh process can use --device cuda.
bool probe_cuda() {
  const pid_t child = fork();
  if (child == 0) _exit(cuda_usable(nullptr) ? 0 : 1);
  int status = 0;
  return child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

#define SKIP_WITHOUT_CUDA()                                                                              \
  do {                                                                                                   \
    if (!runtime::cuda_built()) {                                                                        \
      WARN("skipped: this braid is built without CUDA (no nvcc at configure time)");                     \
      return;                                                                                            \
    }                                                                                                    \
    if (!probe_cuda()) {                                                                                 \
      WARN("skipped: no usable CUDA device (the CUDA trainer is built; the GPU checks run on a machine " \
           "with one)");                                                                                 \
      return;                                                                                            \
    }                                                                                                    \
  } while (0)

TrainOptions device_options() {
  TrainOptions o;
  o.model = GptConfig{2, 2, 32, 16, 256};
  o.batch_size = 8;
  o.grad_accum = 2;
  o.steps = 3;
  o.lr = 1e-2f;
  o.min_lr = 1e-3f;
  o.warmup_steps = 1;
  o.grad_clip = 0.5f;  // acts on every step
  o.bucket_mb = 0.05;  // two buckets
  o.eval_batches = 1;
  o.seed = 5;
  return o;
}

struct Run {
  std::vector<double> loss, grad_norm;
  std::vector<float> params;  // whole model; empty under a mesh
};

Run record(const json& rank0) {
  Run r;
  r.loss = rank0["loss"].get<std::vector<double>>();
  r.grad_norm = rank0["grad_norm"].get<std::vector<double>>();
  if (rank0.contains("params")) r.params = rank0["params"].get<std::vector<float>>();
  return r;
}

// Runs `o` on `ranks` forked ranks and returns rank 0's record.
Run run(int ranks, const TrainOptions& o) {
  const auto steps = test::record_steps(static_cast<int>(o.steps));
  const bool mesh = o.model_parallel();
  const std::vector<json> outs = test::run_trainers(ranks, o, test::synthetic_corpus(), [&](Trainer& t, json& out) {
    steps(t, out);
    if (!mesh) out["params"] = test::gather_params(t);
  });
  return record(outs[0]);
}

double max_param_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::abs(a[i] - b[i])));
  return worst;
}

void check_close(const Run& gpu, const Run& cpu) {
  const double loss = test::max_abs_diff(gpu.loss, cpu.loss);
  const double norm = test::max_abs_diff(gpu.grad_norm, cpu.grad_norm);
  CHECK(loss < 1e-4);
  CHECK(norm < 1e-3 * std::max(1.0, cpu.grad_norm.front()));
  double param = 0.0;
  if (!cpu.params.empty() && !gpu.params.empty()) {  // a mesh's run records no whole model
    param = max_param_diff(gpu.params, cpu.params);
    CHECK(param < 1e-3);
  }
  WARN("GPU vs CPU: loss " << loss << ", grad norm " << norm << ", parameters " << param << " (losses "
       << cpu.loss.front() << " .. " << cpu.loss.back() << ")");
}

}  // namespace

TEST_CASE("device: --device cuda where no GPU can be used is refused by name", "[device]") {
  if (probe_cuda()) return;  // the equivalence cases below run instead
  TrainOptions o = device_options();
  o.strategy = "none";
  o.device = "cuda";
  try {
    Trainer t(o, test::synthetic_corpus());
    FAIL("a trainer on --device cuda was built without a usable GPU");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("--device cuda") != std::string::npos);
  }
  o.device = "tpu";
  CHECK_THROWS_WITH(validate(o), Catch::Contains("choose cpu or cuda"));
}

TEST_CASE("device: every strategy on the GPU trains the CPU's model", "[device]") {
  SKIP_WITHOUT_CUDA();
  TrainOptions o = device_options();
  o.strategy = "none";
  const Run cpu = run(1, o);
  for (const char* strategy : {"none", "dp", "ddp", "zero1", "zero2", "zero3"}) {
    for (int ranks : {1, 2}) {
      if ((std::string(strategy) == "none") != (ranks == 1)) continue;
      INFO(strategy << " on " << ranks << " rank(s)");
      o.strategy = strategy;
      o.device = "cuda";
      check_close(run(ranks, o), cpu);
    }
  }
}

TEST_CASE("device: tensor and pipeline parallelism on the GPU train the CPU's model", "[device]") {
  SKIP_WITHOUT_CUDA();
  TrainOptions o = device_options();
  o.strategy = "none";
  const Run cpu = run(1, o);
  o.strategy = "ddp";
  o.device = "cuda";
  for (auto [tp, pp] : {std::pair{2, 1}, std::pair{1, 2}}) {
    INFO("tp " << tp << " x pp " << pp);
    o.tp = tp;
    o.pp = pp;
    check_close(run(2, o), cpu);
  }
}

TEST_CASE("device: a checkpoint of device memory resumes on the CPU with the same parameters", "[device]") {
  SKIP_WITHOUT_CUDA();
  const fs::path dir = fs::temp_directory_path() / ("braid_device_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TrainOptions o = device_options();
  o.device = "cuda";
  o.checkpoint_dir = dir.string();
  for (const char* strategy : {"none", "zero3"}) {
    INFO(strategy);
    o.strategy = strategy;
    const int ranks = std::string(strategy) == "none" ? 1 : 2;
    const std::vector<json> outs =
        test::run_trainers(ranks, o, test::synthetic_corpus(), [&](Trainer& t, json& out) {
          for (int i = 0; i < o.steps; ++i) t.train_step();
          t.save_checkpoint();
          out["params"] = test::gather_params(t);
        });
    TrainOptions resumed = device_options();
    resumed.strategy = "none";
    resumed.resume = dir.string();
    const std::vector<json> back =
        test::run_trainers(1, resumed, test::synthetic_corpus(), [&](Trainer& t, json& out) {
          out["params"] = test::gather_params(t);
        });
    CHECK(back[0]["params"] == outs[0]["params"]);
    fs::remove_all(dir);
  }
}

}  // namespace braid::trainer
