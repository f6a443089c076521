// Pipeline schedules: free functions that run one step's M micro-batches
// through this rank's stage of the model, moving activations and gradients
// with PipeComm.
//
//   pp_schedule_gpipe  (Huang et al. 2019) all M forwards, then all M
//       backwards. Every stage holds M micro-batches of activations.
//   pp_schedule_1f1b   (PipeDream-Flush, Narayanan et al. 2021; Megatron's
//       non-interleaved schedule) stage s runs P-s-1 warm-up forwards, then
//       alternates one forward and one backward, then cools down with the
//       backwards left. Whatever M, stage s holds at most P-s micro-batches
//       of activations, as many as it has forwards in flight: the next
//       input, which comes in before the last gradient goes out (the order
//       pp_comm.h explains), lands in the activations of the micro-batch
//       whose gradient that is.
//
// Both have the same bubble: with uniform stages, each stage idles for P-1
// of the M+P-1 slots of the step, (P-1)/(M+P-1) of the time (pp_bubble_theory).
//
// Every backward ACCUMULATES into the model's gradients (zero them before
// the step) and seeds each target's loss gradient with `dloss`, e.g.
// 1 / (targets in the global batch). The tied embedding's gradient is not
// summed here: call PipeComm::sum_tied_embedding_grads after the schedule.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "trainer/model/gpt.h"
#include "trainer/strategy/pp_comm.h"

namespace braid::trainer {

// One micro-batch: B sequences of T tokens, row-major [B, T]. The first
// stage reads tokens, the last stage targets; others may pass null.
struct MicroBatch {
  const std::int32_t* tokens = nullptr;
  const std::int32_t* targets = nullptr;
  int B = 0;
  int T = 0;
};

// The Activations of the micro-batches in flight on this stage: taken at a
// micro-batch's forward, given back after its backward, allocated only when
// none is free (so the memory account's activation peak is the schedule's)
// and kept for the next step. Counts how many are in flight.
class ActivationPool {
 public:
  // Each Activations holds a micro-batch of up to B x T.
  ActivationPool(const Gpt& model, int B, int T);

  Activations& acquire();
  void release(Activations& acts);

  int in_flight() const { return in_flight_; }
  int peak_in_flight() const { return peak_in_flight_; }
  std::size_t peak_bytes() const { return peak_bytes_; }
  // Forgets the peaks (e.g. at the start of a step).
  void reset_peaks();

 private:
  const Gpt& model_;
  int B_, T_;
  std::vector<std::unique_ptr<Activations>> owned_;
  std::vector<Activations*> free_;
  int in_flight_ = 0;
  int peak_in_flight_ = 0;
  std::size_t bytes_in_flight_ = 0;
  std::size_t peak_bytes_ = 0;
};

// What one step of a schedule did on this stage.
struct PipelineStats {
  double loss_sum = 0.0;      // last stage: sum over the micro-batches' target losses; else 0
  std::size_t targets = 0;    // last stage: targets those losses cover; else 0
  int peak_in_flight = 0;     // micro-batches of activations held at once
  std::size_t peak_activation_bytes = 0;
  std::chrono::duration<double> busy{};  // in the model's forward and backward pieces
  // Training: the rest of the step's window, which opens and closes with
  // every stage together (PipeComm::synchronize), flush included.
  // Forward only: time in PipeComm calls.
  std::chrono::duration<double> idle{};

  // idle / (busy + idle): the measured counterpart of pp_bubble_theory.
  double bubble_fraction() const;
};

// (P-1) / (M+P-1).
double pp_bubble_theory(int stages, int micro_batches);

// Called by a schedule just before micro-batch i's forward or backward on
// this stage (timed as busy: the stage's own work). A data-parallel
// strategy learns here which backward is the step's last (i == M-1 in
// both schedules), where DDP reduces its buckets; with 1F1B that is not
// after the last forward.
struct PipelineCallbacks {
  std::function<void(int micro_batch)> before_forward;
  std::function<void(int micro_batch)> before_backward;
};

PipelineStats pp_schedule_gpipe(Gpt& model, PipeComm& pipe, ActivationPool& pool,
                                std::span<const MicroBatch> micro_batches, float dloss,
                                const PipelineCallbacks& callbacks = {});
PipelineStats pp_schedule_1f1b(Gpt& model, PipeComm& pipe, ActivationPool& pool,
                               std::span<const MicroBatch> micro_batches, float dloss,
                               const PipelineCallbacks& callbacks = {});
// Forwards only (evaluation): each micro-batch's activations are given
// back as soon as its output is sent. Only the last stage's loss_sum and
// targets are set; targets may be null on every stage (no loss then).
PipelineStats pp_forward_only(Gpt& model, PipeComm& pipe, ActivationPool& pool,
                              std::span<const MicroBatch> micro_batches);

enum class PpSchedule { kGpipe, k1f1b };
// "gpipe", "1f1b".
std::string_view pp_schedule_name(PpSchedule schedule);
// Throws InvalidUsage listing the choices.
PpSchedule parse_pp_schedule(std::string_view text);
// Runs the named schedule.
PipelineStats run_pp_schedule(PpSchedule schedule, Gpt& model, PipeComm& pipe, ActivationPool& pool,
                              std::span<const MicroBatch> micro_batches, float dloss,
                              const PipelineCallbacks& callbacks = {});

}  // namespace braid::trainer
