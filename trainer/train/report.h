// How a run shows itself: a progress bar on a terminal or plain log lines
// otherwise, JSON-lines metrics, and the final summary.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "trainer/strategy/strategy.h"
#include "trainer/strategy/traffic_theory.h"
#include "trainer/train/trainer.h"

namespace braid::trainer {

// A one-line bar on stderr (step, loss, tokens/s, ETA) when stderr is a
// terminal; otherwise a plain line on stderr every ~5% of the run, on every
// evaluation and on the last step. Printed, not logged: progress is the
// tool's output and must not depend on BRAID_LOG_LEVEL.
class ProgressPrinter : public TrainObserver {
 public:
  // log_interval > 0: a line every log_interval steps (and at evaluations
  // and the last step), terminal or not; 0: a bar on a terminal, else
  // about 20 lines.
  explicit ProgressPrinter(bool terminal, std::int64_t log_interval = 0);
  void on_step(const StepReport& r) override;
  void on_checkpoint(const std::filesystem::path& dir, std::int64_t step) override;

 private:
  void draw_bar(const StepReport& r, double eta_s);
  bool terminal_;
  std::int64_t log_interval_;
  bool bar_open_ = false;
  std::int64_t first_step_ = -1;
  std::chrono::steady_clock::time_point start_;
};

// One JSON object per line per step: step, time (wall clock when the line
// is written, unix seconds with microseconds), timestamp (the same instant,
// ISO-8601 UTC, "2026-11-24T08:50:01.123456Z"), loss, lr, grad_norm,
// tokens_per_s, step_ms, this rank's bytes_sent and bytes_received in the
// step in its data-parallel group (the strategy's traffic; tp's and pp's
// are each under "groups"), theory_bytes_sent / theory_bytes_received and
// traffic_ratio (sent / theory; absent when the theory is 0), comm_wait_ms
// and comm_wait_fraction (of the step, in the same group), val_loss (on evaluation steps), peak_memory_bytes by
// category, and "groups": for each of dp, tp, pp with more than one rank,
// its ranks, bus_bytes (counted at each call), theory_bus_bytes,
// transport_bytes_sent and wait_ms; under --tp / --pp also "mesh": this rank's stage's bubble
// (measured) and bubble_theory, peak_activation_bytes, tp_comm_ms and
// pp_comm_ms. Each rank writes its own file (metrics_path()). Throws
// InvalidUsage when the file cannot be created.
class MetricsWriter : public TrainObserver {
 public:
  // A fresh run (resumed_step 0) starts the file afresh. A run resumed from
  // step s keeps the file's lines of steps 1..s and appends to them, so that
  // a restarted job's file holds every step once, as if it had not failed.
  MetricsWriter(const std::string& path, std::int64_t resumed_step);
  // A line that cannot be written (a full disk) ends the metrics with an
  // error on stderr, not the run.
  void on_step(const StepReport& r) override;

 private:
  std::string path_;
  std::ofstream out_;
  bool given_up_ = false;  // a write failed (a full disk): no more lines
};

// Forwards every event to each observer in turn.
class Observers : public TrainObserver {
 public:
  void add(TrainObserver* observer) { list_.push_back(observer); }
  void on_step(const StepReport& r) override;
  void before_checkpoint(std::int64_t step) override;
  void on_checkpoint(const std::filesystem::path& dir, std::int64_t step) override;

 private:
  std::vector<TrainObserver*> list_;
};

// Rank 0 writes `path`, rank r > 0 `path` + ".rank<r>".
std::string metrics_path(const std::string& path, int rank);
// Rank 0's, for the files of ranks this run does not have (rank >=
// world_size) that an earlier run of more ranks left: a run resumed from
// step s trims them to steps 1..s, as it does its own, and a fresh run
// removes them, as it starts its own afresh. Where it went unheeded, a run
// resumed on fewer ranks left a file holding steps it then trained again
// (a review helper's case).
void settle_past_ranks_metrics(const std::string& path, int world_size, std::int64_t resumed_step);

// "parameters 3.3 MiB, gradients 3.3 MiB, ..." of the account's peaks.
std::string format_memory(const MemoryAccount& memory);
// The multi-line summary printed at the end of a run (with the pipeline's
// bubble, peak activations per stage and TP / PP communication per step
// under --tp / --pp).
std::string format_summary(const TrainSummary& summary, const TrainOptions& options);

// One rank's row in the run's tables.
struct RankStats {
  int rank = 0;
  int local_rank = 0;
  int node_rank = 0;
  long pid = 0;
  std::array<double, kMemoryCategoryCount> peak_bytes{};
  MemoryTheory theory;
  // Per step, averaged over this invocation's steps.
  double bytes_sent = 0.0;
  double bytes_received = 0.0;
  TrafficTheory traffic;
  double comm_wait_fraction = 0.0;  // of the step time
  double params = 0.0;              // parameters of this rank's model part (its TP shard of its PP stage)
  double step_ms = 0.0;             // per step, averaged
  GroupSteps groups;                // per step, averaged (ranks: the group's size)
  // Each group's theory formula (not gathered: rank 0's are printed).
  std::array<std::string, 3> group_formulas;
};

// This rank's row: memory peaks and theory, and the averages of `totals`.
RankStats rank_stats(Trainer& trainer, int local_rank, int node_rank);
// Every rank's row, on every rank (collective over the world: an all-gather).
std::vector<RankStats> gather_rank_stats(Trainer& trainer, const RankStats& mine);
// "rank 0: node 0, local rank 0, pid 1234, 7760 parameters", one line per rank.
std::string format_rank_map(const std::vector<RankStats>& ranks);
// Peak bytes per category, one row per rank, with the ZeRO table beside.
// Before the first step (`before_training`) the activations and comm buffers
// are not taken yet: the heading says so, not "peak" (it read as a peak
// up to 8x under the end's, found by a review helper).
std::string format_memory_table(const std::vector<RankStats>& ranks, bool before_training = false);
// Every group's bytes per rank per step (bus bytes counted at each call and
// the transports' bytes) against the theory from the model's shape, and the
// time waited: one row per group of more than one rank and per rank, then
// each group's formula and the values of its letters (`config`, `step`).
std::string format_traffic_table(const std::vector<RankStats>& ranks, const GptConfig& config,
                                 const StepShape& step);

}  // namespace braid::trainer
