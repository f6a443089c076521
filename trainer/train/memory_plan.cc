#include "trainer/train/memory_plan.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "runtime/errors.h"
#include "trainer/model/activations.h"
#include "trainer/model/gpt.h"
#include "trainer/model/param_table.h"
#include "trainer/strategy/compose.h"
#include "trainer/strategy/dp_comm.h"
#include "trainer/strategy/pp_schedule.h"
#include "trainer/strategy/process_groups.h"
#include "trainer/strategy/strategy.h"

namespace braid::trainer {

namespace fs = std::filesystem;

namespace {

// The stage's part of the model; the whole model without --tp / --pp.
ModelLayout stage_layout(const TrainOptions& o, int dp, int stage) {
  if (!o.model_parallel()) return ModelLayout::whole(o.model);
  return mesh_model_layout(o.model, MeshShape{dp, o.tp, o.pp}, MeshCoord{0, 0, stage});
}

// Micro-batches whose activations a stage holds at once.
int micro_batches_in_flight(const TrainOptions& o) {
  if (!o.model_parallel()) return 1;
  return parse_pp_schedule(o.schedule) == PpSchedule::kGpipe ? o.grad_accum : std::min(o.grad_accum, o.pp);
}

// The sum of the `n` largest of `sizes`.
double largest(std::vector<double> sizes, std::size_t n) {
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  double sum = 0.0;
  for (std::size_t i = 0; i < std::min(n, sizes.size()); ++i) sum += sizes[i];
  return sum;
}

// ZeRO-2/3's staging (zero_comm.h), in whole groups. Gradients (ZeRO-2's
// buckets, ZeRO-3's units): the one backward writes and those in flight,
// at most ShardedGradients::kMaxInFlight, the embedding's open throughout:
// the embedding's and the two largest others. Parameters (ZeRO-3): the
// unit gathered, the next one prefetched, and one kept for its next use
// (the head and the embedding between forward and backward): the three
// largest units. On a model of few wide blocks this exceeds what sharding
// saves: 2 layers of 1024 on 4 ranks hold 97 MiB (ZeRO-2) and 194 MiB
// (ZeRO-3) of it against a 24 MiB parameter shard.
double staging_floats(const TrainOptions& o, StrategyKind kind, int dp, const ModelLayout& layout) {
  if (dp <= 1 || (kind != StrategyKind::kZero2 && kind != StrategyKind::kZero3)) return 0.0;
  const ParamTable table = ParamTable::gpt(o.model, layout, static_cast<std::size_t>(dp));
  const bool zero3 = kind == StrategyKind::kZero3;
  const std::vector<Range> groups =
      zero3 ? unit_buckets(table) : plan_buckets(table, static_cast<std::size_t>(o.bucket_mb * (1 << 20)));
  std::vector<double> sizes;
  for (const Range& g : groups) sizes.push_back(static_cast<double>(g.count));
  if (sizes.empty()) return 0.0;
  const double gathered = zero3 ? largest(sizes, 3) : 0.0;
  double embedding = 0.0;
  if (table.embedding_unit() >= 0) {  // plan_buckets puts its group last
    embedding = sizes.back();
    sizes.pop_back();
  }
  return gathered + embedding + largest(sizes, 2);
}

MemoryNeed stage_need(const TrainOptions& o, StrategyKind kind, int dp, int stage) {
  const ModelLayout layout = stage_layout(o, dp, stage);
  const double P = ParamTable::gpt_param_count(o.model, layout);
  const MemoryTheory t = memory_theory(kind, dp, 0, static_cast<std::size_t>(P));
  const double B = std::max(1, o.rank_micro_batch(dp)), T = o.model.block_size;
  // And the attention backward's score gradient, [T, T] (kernels/cpu/
  // attention.cc): at 16384 tokens 1 GiB that the check left out, so a run
  // it passed failed out of memory later (a review helper's case).
  const double acts = micro_batches_in_flight(o) * Activations::float_count(o.model, layout, B, T) +
                      Gpt::scratch_float_count(o.model, layout, B * T) + T * T;
  return MemoryNeed{t.params, t.grads, t.optimizer, acts * sizeof(float),
                    staging_floats(o, kind, dp, layout) * sizeof(float)};
}

// What a run maps beyond its tensors, counted against the address space
// only (it is reserved, not used): OpenBLAS's work buffer per BLAS thread,
// and room for thread stacks and malloc's per-thread arenas.
constexpr double kBlasBufferBytes = 128.0 * (1 << 20);
constexpr double kThreadsReserveBytes = 32.0 * (1 << 20);

}  // namespace

MemoryNeed memory_need(const TrainOptions& o, int world_size) {
  const int dp = std::max(1, o.dp_size(world_size));
  const StrategyKind kind = parse_strategy(strategy_or_default(o.strategy, dp));
  MemoryNeed worst;
  for (int stage = 0; stage < o.pp; ++stage) {
    const MemoryNeed need = stage_need(o, kind, dp, stage);
    if (need.total() > worst.total()) worst = need;
  }
  return worst;
}

std::vector<MemoryLimit> memory_limits(int blas_threads) {
  return runtime::memory_limits(kBlasBufferBytes * std::max(blas_threads, 1) + kThreadsReserveBytes,
                                "OpenBLAS's buffers and threads");
}

void check_memory(const MemoryNeed& need, const std::vector<MemoryLimit>& limits, int local_ranks) {
  auto sharing = [&](const MemoryLimit& l) { return l.per_host ? std::max(1, local_ranks) : 1; };
  // The tightest limit per rank is the one to name.
  const MemoryLimit* tightest = runtime::tightest(limits, local_ranks);
  if (!tightest || need.total() * sharing(*tightest) <= tightest->bytes) return;
  const MemoryLimit& limit = *tightest;
  throw InvalidUsage(
      "this configuration needs " + format_bytes(need.total()) + " per rank (parameters " +
      format_bytes(need.params) + ", gradients " + format_bytes(need.grads) + ", AdamW state " +
      format_bytes(need.optimizer) + ", activations " + format_bytes(need.activations) +
      (need.communication > 0 ? ", communication buffers " + format_bytes(need.communication) : "") + ")" +
      (sharing(limit) > 1 ? " x " + std::to_string(sharing(limit)) + " ranks on this host" : "") + "; " +
      format_bytes(std::max(0.0, limit.bytes)) + " available (" + limit.source +
      "); lower --n-layer, --n-embd, --block-size or the micro-batch (--batch-size, --grad-accum), "
      "or spread the model over more hosts (--strategy zero3, --tp, --pp)");
}

void check_memory(const TrainOptions& o, int world_size, int local_ranks) {
  if (parse_device(o.device) != Device::kCpu) return;
  check_memory(memory_need(o, world_size), memory_limits(o.threads), local_ranks);
}

}  // namespace braid::trainer
