// The MFU denominator: the peak float32 GFLOP/s of the hardware the ranks
// run on, and how it was found.
//
// On CUDA it is the devices' documented fp32 peak (Backend::peak_gflops),
// which no run can beat. On the CPU it is measured, and a measurement on a
// shared machine is only ever too low: load slows it, nothing makes it
// faster than the cores. A peak measured once at start under load gave
// 119% MFU on a pipeline run. So here every rank measures at the same
// moment (after a barrier, so the ranks share the cores as they do in the
// run), at the start and again at the end of training; each rank keeps its
// better measurement, and the peak is their sum. The run's own rate is made
// of the same sgemm and of slower work (smaller GEMMs, attention, layer
// norms, communication), so it cannot beat an undisturbed measurement. If
// both were disturbed and the run still beat their sum, that rate is the
// better lower bound of the peak: the peak becomes the run's rate and the
// label says so. MFU is therefore at most 100% by construction.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "trainer/model/backend.h"

namespace braid::trainer {

struct PeakFlops {
  double gflops = 0.0;   // all ranks together
  std::string source;    // how it was found, for the summary
};

// `peak` unless the run's own rate `achieved_gflops` beat it; then that rate,
// with the source saying why (see the header comment).
PeakFlops bounded_by_run(PeakFlops peak, double achieved_gflops);

class PeakMeter {
 public:
  // `world`: null for one process. `threads`: the BLAS threads the run has set.
  PeakMeter(const Backend& ops, comm::Communicator* world, int threads);

  // Collective over the world when the backend measures: every rank
  // measures together (see the header comment); call at the start and at
  // the end of training. Nothing for a documented peak.
  void measure();
  // The peak for a run that achieved `achieved_gflops` (all ranks):
  // collective (a sum over the world) when measured.
  PeakFlops result(double achieved_gflops);

 private:
  const Backend& ops_;
  comm::Communicator* world_;
  int threads_;
  double best_ = 0.0;  // this rank's best measurement
};

}  // namespace braid::trainer
