#include "trainer/train/report.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "runtime/errors.h"

namespace braid::trainer {

namespace {

constexpr MemoryCategory kCategories[] = {MemoryCategory::kParameters, MemoryCategory::kGradients,
                                          MemoryCategory::kOptimizerState, MemoryCategory::kActivations};

std::string format(const char* fmt, auto... args) {
  char buffer[512];
  std::snprintf(buffer, sizeof(buffer), fmt, args...);
  return buffer;
}

std::string mib(std::size_t bytes) { return format("%.1f MiB", static_cast<double>(bytes) / (1 << 20)); }

std::string duration(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  return format("%lld:%02lld", s / 60, s % 60);
}

std::string val_suffix(const StepReport& r) { return r.val_loss ? format("  val %.4f", *r.val_loss) : ""; }

}  // namespace

ProgressPrinter::ProgressPrinter(bool terminal) : terminal_(terminal) {}

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
  const std::int64_t every = std::max<std::int64_t>(1, r.steps / 20);
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

MetricsWriter::MetricsWriter(const std::string& path) : path_(path), out_(path, std::ios::trunc) {
  if (!out_) throw InvalidUsage("cannot create the metrics file " + path + "; check --metrics");
}

void MetricsWriter::on_step(const StepReport& r) {
  nlohmann::json peak;
  for (auto c : kCategories) peak[std::string(category_name(c))] = r.memory->peak_bytes(c);
  peak["total"] = r.memory->peak_total_bytes();
  nlohmann::json line = {{"step", r.step},          {"loss", r.loss},
                         {"lr", r.lr},              {"grad_norm", r.grad_norm},
                         {"tokens_per_s", r.tokens_per_s}, {"step_ms", r.step_ms},
                         {"bytes_sent", 0},         {"bytes_received", 0},
                         {"peak_memory_bytes", peak}};
  if (r.val_loss) line["val_loss"] = *r.val_loss;
  out_ << line.dump() << '\n';
  out_.flush();
  if (!out_) throw SystemError("writing the metrics file " + path_ + " failed");
}

void Observers::on_step(const StepReport& r) {
  for (auto* o : list_) o->on_step(r);
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

std::string format_summary(const TrainSummary& s, const TrainOptions& o) {
  std::string text = format("trained %lld steps (%lld tokens) in %.1f s\n", static_cast<long long>(s.steps_run),
                            static_cast<long long>(s.tokens), s.train_seconds);
  text += format("train loss %.4f, val loss %.4f\n", s.train_loss, s.val_loss);
  if (s.steps_run > 0) {
    text += format("throughput %.0f tokens/s, %.2f GFLOP/s = %.1f%% of the SGEMM peak (%.2f GFLOP/s: "
                   "%d thread(s) x single-thread 1024^3 sgemm)\n",
                   s.tokens_per_s, s.gflops, 100.0 * s.mfu, s.peak_gflops, o.threads);
    text += format("  FLOPs per token = 6 N + 12 n_layer n_embd T = %.4g\n", s.flops_per_token);
  }
  return text + "peak memory: " + format_memory(*s.memory) + "\n";
}

}  // namespace braid::trainer
