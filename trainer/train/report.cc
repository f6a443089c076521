#include "trainer/train/report.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <utility>

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "runtime/errors.h"

namespace braid::trainer {

namespace {

constexpr MeshAxis kAxes[] = {MeshAxis::kDp, MeshAxis::kTp, MeshAxis::kPp};

constexpr MemoryCategory kCategories[] = {MemoryCategory::kParameters, MemoryCategory::kGradients,
                                          MemoryCategory::kOptimizerState, MemoryCategory::kActivations,
                                          MemoryCategory::kCommunication};

std::string format(const char* fmt, auto... args) {
  char buffer[512];
  std::snprintf(buffer, sizeof(buffer), fmt, args...);
  return buffer;
}

std::string mib(std::size_t bytes) { return format("%.1f MiB", static_cast<double>(bytes) / (1 << 20)); }
double to_mib(double bytes) { return bytes / (1 << 20); }

std::string duration(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  return format("%lld:%02lld", s / 60, s % 60);
}

std::string val_suffix(const StepReport& r) { return r.val_loss ? format("  val %.4f", *r.val_loss) : ""; }

// The wall clock as unix seconds and as ISO-8601 UTC with microseconds.
std::pair<double, std::string> wall_clock() {
  const auto now = std::chrono::system_clock::now();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(us / 1000000);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char text[40];
  const std::size_t n = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(text + n, sizeof text - n, ".%06lldZ", static_cast<long long>(us % 1000000));
  return {static_cast<double>(us) / 1e6, text};
}

}  // namespace

ProgressPrinter::ProgressPrinter(bool terminal, std::int64_t log_interval)
    : terminal_(terminal && log_interval == 0), log_interval_(log_interval) {}

void ProgressPrinter::on_step(const StepReport& r) {
  if (first_step_ < 0) {
    first_step_ = r.step - 1;
    start_ = std::chrono::steady_clock::now();
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = elapsed / static_cast<double>(r.step - first_step_) * static_cast<double>(r.steps - r.step);
  if (terminal_) {
    if (r.val_loss) {
      std::fprintf(stderr, "\r\033[Kstep %lld: val loss %.4f\n", static_cast<long long>(r.step), *r.val_loss);
    }
    draw_bar(r, eta);
    return;
  }
  const std::int64_t every = log_interval_ > 0 ? log_interval_ : std::max<std::int64_t>(1, r.steps / 20);
  if (r.step % every == 0 || r.val_loss || r.step == r.steps) {
    std::fprintf(stderr, "step %lld/%lld  loss %.4f  lr %.2e  norm %.3f  %.0f tok/s  %.1f ms%s\n",
                 static_cast<long long>(r.step), static_cast<long long>(r.steps), r.loss, r.lr, r.grad_norm,
                 r.tokens_per_s, r.step_ms, val_suffix(r).c_str());
  }
}

void ProgressPrinter::draw_bar(const StepReport& r, double eta_s) {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * r.step / std::max<std::int64_t>(1, r.steps));
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  std::fprintf(stderr, "\r\033[K[%s] %lld/%lld  loss %.4f  %.0f tok/s  ETA %s", bar.c_str(),
               static_cast<long long>(r.step), static_cast<long long>(r.steps), r.loss, r.tokens_per_s,
               duration(eta_s).c_str());
  bar_open_ = r.step < r.steps;
  if (!bar_open_) std::fputc('\n', stderr);
  std::fflush(stderr);
}

void ProgressPrinter::on_checkpoint(const std::filesystem::path& dir, std::int64_t step) {
  if (terminal_ && bar_open_) std::fputs("\r\033[K", stderr);
  std::fprintf(stderr, "checkpoint of step %lld written to %s\n", static_cast<long long>(step), dir.c_str());
}

namespace {

// The lines of an existing metrics file for steps up to `step`: what a run
// resumed from that step's checkpoint keeps. Lines past it (steps the run
// lost and trains again) and lines that are not a step's go.
std::string metrics_up_to(const std::string& path, std::int64_t step) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<std::int64_t>() <= step)
      kept += line + "\n";
  }
  return kept;
}

}  // namespace

void settle_past_ranks_metrics(const std::string& path, int world_size, std::int64_t resumed_step) {
  for (int rank = std::max(world_size, 1);; ++rank) {
    const std::string file = metrics_path(path, rank);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec)) return;
    if (resumed_step <= 0) {
      std::filesystem::remove(file, ec);
      continue;
    }
    const std::string kept = metrics_up_to(file, resumed_step);
    std::ofstream out(file, std::ios::trunc);
    out << kept;
  }
}

MetricsWriter::MetricsWriter(const std::string& path, std::int64_t resumed_step) : path_(path) {
  const std::string kept = resumed_step > 0 ? metrics_up_to(path, resumed_step) : std::string();
  out_.open(path, std::ios::trunc);
  if (!out_) throw InvalidUsage("cannot create the metrics file " + path + "; check --metrics");
  out_ << kept;
}

void MetricsWriter::on_step(const StepReport& r) {
  nlohmann::json peak;
  for (auto c : kCategories) peak[std::string(category_name(c))] = r.memory->peak_bytes(c);
  peak["total"] = r.memory->peak_total_bytes();
  const auto [unix_s, iso] = wall_clock();
  nlohmann::json line = {{"step", r.step},
                         {"time", unix_s},
                         {"timestamp", iso},
                         {"loss", r.loss},
                         {"lr", r.lr},
                         {"grad_norm", r.grad_norm},
                         {"tokens_per_s", r.tokens_per_s},
                         {"step_ms", r.step_ms},
                         {"bytes_sent", r.bytes_sent},
                         {"bytes_received", r.bytes_received},
                         {"theory_bytes_sent", r.theory.sent},
                         {"theory_bytes_received", r.theory.received},
                         {"comm_wait_ms", r.comm_wait_ms},
                         {"comm_wait_fraction", r.step_ms > 0 ? r.comm_wait_ms / r.step_ms : 0.0},
                         {"peak_memory_bytes", peak}};
  // The data-parallel group's bus bytes over their theory, as the printed
  // table's ratio (it divided the transport bytes, which direct and
  // one-shot calls keep below the bus bytes, by the bus-byte theory).
  const GroupStep& dp = group(r.groups, MeshAxis::kDp);
  if (dp.theory_bus_bytes > 0) line["traffic_ratio"] = dp.bus_bytes / dp.theory_bus_bytes;
  for (MeshAxis axis : kAxes) {
    const GroupStep& g = group(r.groups, axis);
    if (g.ranks <= 1) continue;
    line["groups"][std::string(axis_name(axis))] = {{"ranks", g.ranks},
                                                    {"bus_bytes", g.bus_bytes},
                                                    {"theory_bus_bytes", g.theory_bus_bytes},
                                                    {"transport_bytes_sent", g.transport_bytes_sent},
                                                    {"wait_ms", g.wait_ms}};
  }
  if (r.val_loss) line["val_loss"] = *r.val_loss;
  if (r.mesh) {
    line["mesh"] = {{"bubble", r.bubble},
                    {"bubble_theory", r.bubble_theory},
                    {"peak_activation_bytes", r.peak_activation_bytes},
                    {"tp_comm_ms", r.tp_comm_ms},
                    {"pp_comm_ms", r.pp_comm_ms}};
  }
  if (given_up_) return;
  errno = 0;
  out_ << line.dump() << '\n';
  out_.flush();
  if (out_) return;
  // A full disk under the metrics file ended the run, and with it the
  // training done since the last checkpoint (found by a review helper):
  // the metrics stop, loudly, and the training goes on.
  given_up_ = true;
  spdlog::error("writing the metrics file {} failed{}; the metrics of step {} and later are not recorded, and "
                "training goes on",
                path_, errno != 0 ? std::string(": ") + std::strerror(errno) : std::string(), r.step);
}

std::string metrics_path(const std::string& path, int rank) {
  return rank == 0 ? path : path + ".rank" + std::to_string(rank);
}

void Observers::on_step(const StepReport& r) {
  for (auto* o : list_) o->on_step(r);
}

void Observers::before_checkpoint(std::int64_t step) {
  for (auto* o : list_) o->before_checkpoint(step);
}

void Observers::on_checkpoint(const std::filesystem::path& dir, std::int64_t step) {
  for (auto* o : list_) o->on_checkpoint(dir, step);
}

std::string format_memory(const MemoryAccount& memory) {
  std::string s;
  for (auto c : kCategories) {
    std::string name(category_name(c));
    std::replace(name.begin(), name.end(), '_', ' ');
    s += name + " " + mib(memory.peak_bytes(c)) + ", ";
  }
  return s + "total " + mib(memory.peak_total_bytes());
}

namespace {

std::string per_stage(const std::vector<double>& values, double scale, const char* unit) {
  std::string text;
  for (std::size_t i = 0; i < values.size(); ++i) {
    text += format("%s%.3g%s", i == 0 ? "" : ", ", values[i] * scale, unit);
  }
  return text;
}

std::string format_mesh(const MeshSummary& m) {
  std::string text = format("mesh dp %d x tp %d x pp %d, schedule %s, %d micro-batch(es) per step\n", m.shape.dp,
                            m.shape.tp, m.shape.pp, m.schedule.c_str(), m.micro_batches);
  text += format("  idle per stage (measured after the first step: not computing / the pipeline window, flush included): %s; "
                 "theory (P-1)/(M+P-1) = %.3f\n",
                 per_stage(m.bubble, 1.0, "").c_str(), m.bubble_theory);
  if (m.shape.pp > 1 && !m.compute_ms_per_step.empty()) {
    // The slowest stage never waits for a slower one: its idle time is the
    // schedule's bubble alone, which the theory describes. The other stages
    // also wait for it, in proportion to the imbalance.
    const auto slowest = std::max_element(m.compute_ms_per_step.begin(), m.compute_ms_per_step.end());
    const auto fastest = std::min_element(m.compute_ms_per_step.begin(), m.compute_ms_per_step.end());
    const auto s = static_cast<std::size_t>(slowest - m.compute_ms_per_step.begin());
    const double bubble = m.bubble[s];
    text += format("  pipeline bubble (idle of the slowest stage, %zu): %.3f = %.2f x theory\n", s, bubble,
                   m.bubble_theory > 0 ? bubble / m.bubble_theory : 0.0);
    text += format("  compute per step, stage by stage: %s (slowest / fastest %.3f)\n",
                   per_stage(m.compute_ms_per_step, 1.0, " ms").c_str(), *fastest > 0 ? *slowest / *fastest : 0.0);
  }
  text += "  peak activation memory per stage: " + per_stage(m.peak_activation_bytes, 1.0 / (1 << 20), " MiB") + "\n";
  text += "  per step, stage by stage: TP all-reduce wait " + per_stage(m.tp_comm_ms_per_step, 1.0, " ms") +
          "; PP send/recv wait " + per_stage(m.pp_comm_ms_per_step, 1.0, " ms") + "\n";
  return text;
}

}  // namespace

std::string format_summary(const TrainSummary& s, const TrainOptions& o) {
  std::string text = format("trained %lld steps (%lld tokens) in %.1f s\n", static_cast<long long>(s.steps_run),
                            static_cast<long long>(s.tokens), s.train_seconds);
  text += format("train loss %.4f, val loss %.4f\n", s.train_loss, s.val_loss);
  if (s.steps_run > 0) {
    // Two significant digits at least: a small model on a many-core peak
    // printed 0.0% MFU for a rate above zero.
    const double percent = 100.0 * s.mfu;
    int decimals = 1;
    while (decimals < 6 && percent > 0 && percent < std::pow(10.0, 1 - decimals)) ++decimals;
    text += format("throughput %.0f tokens/s, %.2f GFLOP/s = %.*f%% MFU (peak %.2f GFLOP/s: %s)\n", s.tokens_per_s,
                   s.gflops, decimals, percent, s.peak_gflops, s.peak_source.c_str());
    text += format("  FLOPs per token = 6 N + 12 n_layer n_embd T = %.4g\n", s.flops_per_token);
  }
  if (s.mesh) text += format_mesh(*s.mesh);
  return text + "peak memory: " + format_memory(*s.memory) + "\n";
}

RankStats rank_stats(Trainer& trainer, int local_rank, int node_rank) {
  Strategy& strategy = trainer.strategy();
  RankStats s;
  s.rank = trainer.mesh() != nullptr ? trainer.rank() : strategy.rank();
  s.local_rank = local_rank;
  s.node_rank = node_rank;
  s.pid = static_cast<long>(::getpid());
  for (auto c : kCategories) s.peak_bytes[static_cast<std::size_t>(c)] = trainer.memory().peak_bytes(c);
  s.theory = memory_theory(strategy.kind(), strategy.world_size(), strategy.rank(),
                           trainer.model().table().param_count());
  s.traffic = strategy.traffic_theory(trainer.options().grad_accum);
  const CommTotals& t = trainer.comm_totals();
  if (t.steps > 0) {
    s.bytes_sent = t.bytes_sent / static_cast<double>(t.steps);
    s.bytes_received = t.bytes_received / static_cast<double>(t.steps);
  }
  if (t.step_seconds > 0) s.comm_wait_fraction = t.wait_seconds / t.step_seconds;
  s.params = static_cast<double>(trainer.model().table().param_count());
  const double steps = static_cast<double>(std::max<std::int64_t>(t.steps, 1));
  s.step_ms = t.step_seconds * 1e3 / steps;
  for (MeshAxis axis : kAxes) {
    const GroupStep& sum = group(t.groups, axis);
    GroupStep& mine = group(s.groups, axis);
    mine = {trainer.group_size(axis), sum.bus_bytes / steps, trainer.group_theory(axis).bus,
            sum.transport_bytes_sent / steps, sum.wait_ms / steps};
    s.group_formulas[static_cast<std::size_t>(axis)] = trainer.group_theory(axis).formula;
  }
  return s;
}

namespace {

// A row as doubles for the all-gather (every value fits a double exactly).
constexpr std::size_t kGroupCount = 5;
constexpr std::size_t kStatsCount = 4 + kMemoryCategoryCount + 3 + 7 + 3 * kGroupCount;

std::array<double, kStatsCount> pack(const RankStats& s) {
  std::array<double, kStatsCount> a{};
  std::size_t i = 0;
  for (double x : {double(s.rank), double(s.local_rank), double(s.node_rank), double(s.pid)}) a[i++] = x;
  for (double x : s.peak_bytes) a[i++] = x;
  for (double x : {s.theory.params, s.theory.grads, s.theory.optimizer, s.bytes_sent, s.bytes_received,
                   s.traffic.sent, s.traffic.received, s.comm_wait_fraction, s.params, s.step_ms}) {
    a[i++] = x;
  }
  for (const GroupStep& g : s.groups) {
    for (double x : {double(g.ranks), g.bus_bytes, g.theory_bus_bytes, g.transport_bytes_sent, g.wait_ms}) a[i++] = x;
  }
  return a;
}

// `mine`: this rank's row, whose strings every row takes.
RankStats unpack(const double* a, const RankStats& mine) {
  RankStats s;
  s.rank = static_cast<int>(a[0]);
  s.local_rank = static_cast<int>(a[1]);
  s.node_rank = static_cast<int>(a[2]);
  s.pid = static_cast<long>(a[3]);
  std::size_t i = 4;
  for (double& x : s.peak_bytes) x = a[i++];
  s.theory = {a[i], a[i + 1], a[i + 2]};
  s.bytes_sent = a[i + 3];
  s.bytes_received = a[i + 4];
  s.traffic = {a[i + 5], a[i + 6], mine.traffic.formula};
  s.comm_wait_fraction = a[i + 7];
  s.params = a[i + 8];
  s.step_ms = a[i + 9];
  i += 10;
  for (GroupStep& g : s.groups) {
    g = {static_cast<int>(a[i]), a[i + 1], a[i + 2], a[i + 3], a[i + 4]};
    i += kGroupCount;
  }
  s.group_formulas = mine.group_formulas;
  return s;
}

// "42.8 KiB": bytes in the unit that keeps three or four digits.
std::string bytes_text(double bytes) {
  if (bytes < 1024) return format("%.0f B", bytes);
  if (bytes < 1024.0 * 1024) return format("%.1f KiB", bytes / 1024);
  if (bytes < 1024.0 * 1024 * 1024) return format("%.2f MiB", bytes / (1 << 20));
  return format("%.2f GiB", bytes / (1 << 30));
}

std::string ratio(double measured, double theory) { return theory > 0 ? format("%6.3f", measured / theory) : "     -"; }

}  // namespace

std::vector<RankStats> gather_rank_stats(Trainer& trainer, const RankStats& mine) {
  comm::Communicator* comm = trainer.mesh() != nullptr ? trainer.world() : trainer.strategy().comm();
  if (comm == nullptr) return {mine};
  const std::array<double, kStatsCount> row = pack(mine);
  std::vector<double> all(kStatsCount * static_cast<std::size_t>(comm->size()));
  comm::Work work = comm->all_gather(row.data(), all.data(), kStatsCount, DataType::f64);
  work.wait();
  std::vector<RankStats> ranks;
  for (int r = 0; r < comm->size(); ++r) ranks.push_back(unpack(all.data() + r * kStatsCount, mine));
  return ranks;
}

std::string format_rank_map(const std::vector<RankStats>& ranks) {
  std::string text = "rank map:\n";
  for (const RankStats& s : ranks) {
    text += format("  rank %d: node %d, local rank %d, pid %ld, %.0f parameters\n", s.rank, s.node_rank, s.local_rank,
                   s.pid, s.params);
  }
  return text;
}

std::string format_memory_table(const std::vector<RankStats>& ranks, bool before_training) {
  std::string text =
      std::string(before_training ? "memory per rank before the first step, MiB (activations and comm buffers grow in "
                                    "it; the peak comes at the end; theory: the ZeRO table; padding and staging not "
                                    "in it):\n"
                                  : "memory per rank, peak MiB (theory: the ZeRO table; padding and staging not in "
                                    "it):\n") +
      "  rank  parameters (theory)  gradients (theory)  optimizer (theory)  activations  comm buffers\n";
  auto peak = [](const RankStats& s, MemoryCategory c) { return to_mib(s.peak_bytes[static_cast<std::size_t>(c)]); };
  for (const RankStats& s : ranks) {
    text += format("  %4d  %10.3f %8.3f  %9.3f %8.3f  %9.3f %8.3f  %11.3f  %12.3f\n", s.rank,
                   peak(s, MemoryCategory::kParameters), to_mib(s.theory.params), peak(s, MemoryCategory::kGradients),
                   to_mib(s.theory.grads), peak(s, MemoryCategory::kOptimizerState), to_mib(s.theory.optimizer),
                   peak(s, MemoryCategory::kActivations), peak(s, MemoryCategory::kCommunication));
  }
  return text;
}

std::string format_traffic_table(const std::vector<RankStats>& ranks, const GptConfig& config,
                                 const StepShape& step) {
  std::string text =
      "traffic per rank per step, by group (sent: bus bytes, each call counted as nccl-tests counts it:\n"
      "  all-reduce 2(n-1)/n x S, reduce-scatter and all-gather (n-1)/n x S, broadcast, reduce and send S;\n"
      "  theory: from the model's shape, without the step's few 8-byte sums of loss and norm; transport: what\n"
      "  the group's transports carried, less where direct and one-shot calls read peers' shared memory):\n"
      "  group  ranks  rank   sent (bus)      theory   ratio    transport   wait\n";
  std::string formulas;
  for (MeshAxis axis : kAxes) {
    if (ranks.empty() || group(ranks[0].groups, axis).ranks <= 1) continue;
    for (const RankStats& s : ranks) {
      const GroupStep& g = group(s.groups, axis);
      text += format("  %-5s  %5d  %4d  %11s  %11s  %s  %11s  %5.1f%%\n", std::string(axis_name(axis)).c_str(),
                     g.ranks, s.rank, bytes_text(g.bus_bytes).c_str(), bytes_text(g.theory_bus_bytes).c_str(),
                     ratio(g.bus_bytes, g.theory_bus_bytes).c_str(), bytes_text(g.transport_bytes_sent).c_str(),
                     s.step_ms > 0 ? 100.0 * g.wait_ms / s.step_ms : 0.0);
    }
    formulas += format("  theory %s: %s\n", std::string(axis_name(axis)).c_str(),
                       ranks[0].group_formulas[static_cast<std::size_t>(axis)].c_str());
  }
  const bool model_parallel = !ranks.empty() && (group(ranks[0].groups, MeshAxis::kTp).ranks > 1 ||
                                                  group(ranks[0].groups, MeshAxis::kPp).ranks > 1);
  if (!model_parallel) return text + formulas;
  return text + formulas +
         format("  with B = %d sequences per micro-batch, T = %d, C = %d, V = %d, M = %d micro-batch(es) per step; "
                "the formulas are rank 0's\n",
                step.B, step.T, config.n_embd, config.vocab_size, step.micro_batches);
}

}  // namespace braid::trainer
