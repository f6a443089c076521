// How a run shows itself: a progress bar on a terminal or plain log lines
// otherwise, JSON-lines metrics, and the final summary.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "trainer/train/trainer.h"

namespace braid::trainer {

// A one-line bar on stderr (step, loss, tokens/s, ETA) when stderr is a
// terminal; otherwise a plain line on stderr every ~5% of the run, on every
// evaluation and on the last step. Printed, not logged: progress is the
// tool's output and must not depend on BRAID_LOG_LEVEL.
class ProgressPrinter : public TrainObserver {
 public:
  explicit ProgressPrinter(bool terminal);
  void on_step(const StepReport& r) override;
  void on_checkpoint(const std::filesystem::path& dir, std::int64_t step) override;

 private:
  void draw_bar(const StepReport& r, double eta_s);
  bool terminal_;
  bool bar_open_ = false;
  std::int64_t first_step_ = -1;
  std::chrono::steady_clock::time_point start_;
};

// One JSON object per line per step: step, loss, lr, grad_norm,
// tokens_per_s, step_ms, bytes_sent, bytes_received (0 until strategies
// communicate), val_loss (on evaluation steps) and peak_memory_bytes by
// category. Throws InvalidUsage when the file cannot be created.
class MetricsWriter : public TrainObserver {
 public:
  explicit MetricsWriter(const std::string& path);
  void on_step(const StepReport& r) override;

 private:
  std::string path_;
  std::ofstream out_;
};

// Forwards every event to each observer in turn.
class Observers : public TrainObserver {
 public:
  void add(TrainObserver* observer) { list_.push_back(observer); }
  void on_step(const StepReport& r) override;
  void on_checkpoint(const std::filesystem::path& dir, std::int64_t step) override;

 private:
  std::vector<TrainObserver*> list_;
};

// "parameters 3.3 MiB, gradients 3.3 MiB, ..." of the account's peaks.
std::string format_memory(const MemoryAccount& memory);
// The multi-line summary printed at the end of a run.
std::string format_summary(const TrainSummary& summary, const TrainOptions& options);

}  // namespace braid::trainer
