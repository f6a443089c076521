#include "trainer/train/memory_plan.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "runtime/errors.h"
#include "trainer/model/activations.h"
#include "trainer/model/gpt.h"
#include "trainer/model/param_table.h"
#include "trainer/strategy/compose.h"
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

MemoryNeed stage_need(const TrainOptions& o, StrategyKind kind, int dp, int stage) {
  const ModelLayout layout = stage_layout(o, dp, stage);
  const double P = ParamTable::gpt_param_count(o.model, layout);
  const MemoryTheory t = memory_theory(kind, dp, 0, static_cast<std::size_t>(P));
  const double B = std::max(1, o.rank_micro_batch(dp)), T = o.model.block_size;
  const double acts = micro_batches_in_flight(o) * Activations::float_count(o.model, layout, B, T) +
                      Gpt::scratch_float_count(o.model, layout, B * T);
  return MemoryNeed{t.params, t.grads, t.optimizer, acts * sizeof(float)};
}

// The first number of a file ("max" and unreadable files: none).
std::optional<double> read_number(const fs::path& path) {
  std::ifstream in(path);
  double value = 0;
  if (!(in >> value)) return std::nullopt;
  return value;
}

std::optional<MemoryLimit> mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (in >> key >> kib) {
    if (key == "MemAvailable:") return MemoryLimit{kib * 1024, "MemAvailable in /proc/meminfo", true};
    in.ignore(256, '\n');
  }
  return std::nullopt;
}

// memory.max - memory.current of this process's cgroup v2 and each
// ancestor ("0::/path" in /proc/self/cgroup); the tightest.
std::optional<MemoryLimit> cgroup_limit() {
  std::ifstream in("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  if (path.empty()) return std::nullopt;
  std::optional<MemoryLimit> tightest;
  for (fs::path p = path; !p.empty(); p = p == p.parent_path() ? fs::path() : p.parent_path()) {
    const fs::path dir = fs::path("/sys/fs/cgroup") / p.relative_path();
    const auto max = read_number(dir / "memory.max");
    if (!max) continue;
    const double left = *max - read_number(dir / "memory.current").value_or(0.0);
    if (!tightest || left < tightest->bytes) {
      tightest = MemoryLimit{left, "the cgroup limit " + (dir / "memory.max").string() + " less memory.current", true};
    }
  }
  return tightest;
}

// What a run maps beyond its tensors, counted against the address space
// only (it is reserved, not used): OpenBLAS's work buffer per BLAS thread,
// and room for thread stacks and malloc's per-thread arenas.
constexpr double kBlasBufferBytes = 128.0 * (1 << 20);
constexpr double kThreadsReserveBytes = 32.0 * (1 << 20);

std::optional<MemoryLimit> address_space_limit(int blas_threads) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  const double mapped = read_number("/proc/self/statm").value_or(0.0) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  const double reserved = kBlasBufferBytes * std::max(blas_threads, 1) + kThreadsReserveBytes;
  return MemoryLimit{static_cast<double>(limit.rlim_cur) - mapped - reserved,
                     "the address-space limit (ulimit -v) less what this process maps and " + format_bytes(reserved) +
                         " for OpenBLAS's buffers and threads",
                     false};
}

}  // namespace

std::string format_bytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char text[64];
  std::snprintf(text, sizeof(text), u == 0 ? "%.0f %s" : "%.3g %s", bytes, units[u]);
  return text;
}

MemoryNeed memory_need(const TrainOptions& o, int world_size) {
  const int dp = std::max(1, o.dp_size(world_size));
  const StrategyKind kind = o.strategy.empty() ? default_strategy(dp) : parse_strategy(o.strategy);
  MemoryNeed worst;
  for (int stage = 0; stage < o.pp; ++stage) {
    const MemoryNeed need = stage_need(o, kind, dp, stage);
    if (need.total() > worst.total()) worst = need;
  }
  return worst;
}

std::vector<MemoryLimit> memory_limits(int blas_threads) {
  std::vector<MemoryLimit> limits;
  for (auto limit : {mem_available(), cgroup_limit(), address_space_limit(blas_threads)}) {
    if (limit) limits.push_back(*limit);
  }
  return limits;
}

void check_memory(const MemoryNeed& need, const std::vector<MemoryLimit>& limits, int local_ranks) {
  auto sharing = [&](const MemoryLimit& l) { return l.per_host ? std::max(1, local_ranks) : 1; };
  // The tightest limit per rank is the one to name.
  const auto tightest = std::min_element(limits.begin(), limits.end(), [&](const auto& a, const auto& b) {
    return a.bytes / sharing(a) < b.bytes / sharing(b);
  });
  if (tightest == limits.end() || need.total() * sharing(*tightest) <= tightest->bytes) return;
  const MemoryLimit& limit = *tightest;
  throw InvalidUsage(
      "this configuration needs " + format_bytes(need.total()) + " per rank (parameters " +
      format_bytes(need.params) + ", gradients " + format_bytes(need.grads) + ", AdamW state " +
      format_bytes(need.optimizer) + ", activations " + format_bytes(need.activations) + ")" +
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
