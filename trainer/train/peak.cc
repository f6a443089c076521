#include "trainer/train/peak.h"

#include <algorithm>
#include <cstdio>

namespace braid::trainer {

namespace {

std::string gflops_text(double gflops) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", gflops);
  return text;
}

}  // namespace

PeakFlops bounded_by_run(PeakFlops peak, double achieved_gflops) {
  if (achieved_gflops <= peak.gflops) return peak;
  peak.source += "; the run beat the measured " + gflops_text(peak.gflops) +
                 " GFLOP/s (load slowed the measurements), so the peak is the run's own rate";
  peak.gflops = achieved_gflops;
  return peak;
}

PeakMeter::PeakMeter(const Backend& ops, comm::Communicator* world, int threads)
    : ops_(ops), world_(world), threads_(threads) {}

void PeakMeter::measure() {
  if (!ops_.peak_is_measured()) return;
  if (world_ != nullptr && world_->size() > 1) world_->barrier().wait();
  best_ = std::max(best_, ops_.peak_gflops(1, threads_));
}

PeakFlops PeakMeter::result(double achieved_gflops) {
  const int ranks = world_ != nullptr ? world_->size() : 1;
  if (!ops_.peak_is_measured()) {
    return bounded_by_run({ops_.peak_gflops(ranks, threads_), ops_.peak_source(ranks, threads_)}, achieved_gflops);
  }
  double sum = best_;
  if (world_ != nullptr && ranks > 1) world_->all_reduce(&sum, &sum, 1, DataType::f64, ReduceOp::sum).wait();
  const int rank = world_ != nullptr ? world_->rank() : 0;
  PeakFlops peak{sum, "measured, " + ops_.peak_source(ranks, threads_) + ", by all ranks at once at the start and the "
                          "end of training, each rank's best summed (rank " + std::to_string(rank) + ": " +
                          gflops_text(best_) + ")"};
  return bounded_by_run(peak, achieved_gflops);
}

}  // namespace braid::trainer
