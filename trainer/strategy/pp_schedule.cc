// The schedules, written as their pseudocode: warm-up, steady state and
// cool-down blocks of Stage calls, each naming the micro-batch it moves.
//
// Stage keeps, per micro-batch, the Activations it holds from its first use
// (the recv of its input, or its forward on the first stage) until its
// input gradient has been sent (or its backward ran, on the first stage);
// in 1F1B's steady state the next micro-batch takes them over as that
// gradient goes (send_backward_recv_forward).
// A training step's window opens and closes with a barrier over the
// pipeline (PipeComm::synchronize), so every stage measures over the same
// interval, from the moment all stages start to the flush: the last
// stage's time waiting for the first stage's final backwards counts as
// idle, as in the theory. The model's forward and backward are timed as
// busy, with the strategy's callbacks before them (zeroing the gradients,
// DDP's bucket bookkeeping: the stage's own work); the rest of the window
// is idle: with blocking point-to-point calls a stage is either computing
// or waiting for a neighbour.
#include "trainer/strategy/pp_schedule.h"

#include <algorithm>

#include "runtime/errors.h"

namespace braid::trainer {

ActivationPool::ActivationPool(const Gpt& model, int B, int T) : model_(model), B_(B), T_(T) {}

Activations& ActivationPool::acquire() {
  if (free_.empty()) {
    owned_.push_back(std::make_unique<Activations>(model_.make_activations(B_, T_)));
    free_.push_back(owned_.back().get());
  }
  Activations* acts = free_.back();
  free_.pop_back();
  ++in_flight_;
  bytes_in_flight_ += acts->bytes();
  peak_in_flight_ = std::max(peak_in_flight_, in_flight_);
  peak_bytes_ = std::max(peak_bytes_, bytes_in_flight_);
  return *acts;
}

void ActivationPool::release(Activations& acts) {
  --in_flight_;
  bytes_in_flight_ -= acts.bytes();
  free_.push_back(&acts);
}

void ActivationPool::reset_peaks() {
  peak_in_flight_ = in_flight_;
  peak_bytes_ = bytes_in_flight_;
}

double PipelineStats::bubble_fraction() const {
  const double total = (busy + idle).count();
  return total > 0.0 ? idle.count() / total : 0.0;
}

double pp_bubble_theory(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / (micro_batches + stages - 1);
}

namespace {

using Clock = std::chrono::steady_clock;

// One stage's view of one step: the micro-batches' activations and the
// point-to-point calls that fill and drain them.
class Stage {
 public:
  // `training`: backwards follow, so the last stage needs every target.
  Stage(Gpt& model, PipeComm& pipe, ActivationPool& pool, std::span<const MicroBatch> micro_batches,
        float dloss, const PipelineCallbacks& callbacks, bool training)
      : model_(model), pipe_(pipe), pool_(pool), mbs_(micro_batches), dloss_(dloss), callbacks_(callbacks),
        acts_(micro_batches.size(), nullptr), windowed_(training) {
    check_micro_batches(training);
    pool_.reset_peaks();
    if (windowed_) pipe_.synchronize();
    window_start_ = Clock::now();
    idle_start_ = pipe_.blocked();
  }

  // Gives back what an interrupted step (an exception) still holds.
  ~Stage() {
    for (std::size_t i = 0; i < acts_.size(); ++i) {
      if (acts_[i] != nullptr) release(static_cast<int>(i));
    }
  }
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  int micro_batches() const { return static_cast<int>(mbs_.size()); }

  void forward(int i) {
    const auto start = Clock::now();
    if (callbacks_.before_forward) callbacks_.before_forward(i);
    const float loss = model_.forward(acts(i), mbs_[i].tokens, mbs_[i].targets);
    busy_ += Clock::now() - start;
    if (pipe_.is_last_stage() && mbs_[i].targets != nullptr) {
      stats_.loss_sum += static_cast<double>(loss) * elements(i);
      stats_.targets += elements(i);
    }
  }

  void backward(int i) {
    const auto start = Clock::now();
    if (callbacks_.before_backward) callbacks_.before_backward(i);
    model_.backward(acts(i), dloss_);
    busy_ += Clock::now() - start;
  }

  void recv_forward(int i) { pipe_.recv_forward(input(i), count(i)); }
  void send_forward(int i) { pipe_.send_forward(output(i), count(i)); }
  void recv_backward(int i) { pipe_.recv_backward(acts(i).dresidual(), count(i)); }
  void send_backward(int i) {
    pipe_.send_backward(acts(i).dresidual(), count(i));
    release(i);
  }
  // Forward micro-batch f's output goes down as backward micro-batch b's gradient comes up.
  void send_forward_recv_backward(int f, int b) {
    pipe_.send_forward_recv_backward(output(f), count(f), acts(b).dresidual(), count(b));
  }
  // Backward micro-batch b's input gradient goes up as forward micro-batch
  // f's input comes down. b's backward is over and only its input gradient
  // (dresidual) is still to go, so f takes b's Activations and receives its
  // input there (input() and dresidual() are apart, at fixed places): a
  // stage holds no more micro-batches than it has forwards in flight. With
  // an Activations of its own, f's input arrived while b's were held, one
  // more (P-s+1 on stage s > 0, where the first stage holds P).
  void send_backward_recv_forward(int b, int f) {
    if (acts_[f] != nullptr) throw InvalidUsage("micro-batch " + std::to_string(f) + " began twice");
    Activations& handed = acts(b);
    acts_[b] = nullptr;
    acts_[f] = &handed;
    handed.set_shape(mbs_[f].B, mbs_[f].T);
    pipe_.send_backward_recv_forward(handed.dresidual(), count(b), input(f), count(f));
  }

  // Gives micro-batch i's activations back to the pool.
  void release(int i) {
    pool_.release(*acts_[i]);
    acts_[i] = nullptr;
  }

  PipelineStats finish() {
    stats_.peak_in_flight = pool_.peak_in_flight();
    stats_.peak_activation_bytes = pool_.peak_bytes();
    stats_.busy = busy_;
    if (windowed_) {
      pipe_.synchronize();
      stats_.idle = std::chrono::duration<double>(Clock::now() - window_start_) - stats_.busy;
    } else {
      stats_.idle = pipe_.blocked() - idle_start_;
    }
    return stats_;
  }

 private:
  // Micro-batch i's activations, taken from the pool at first use.
  Activations& acts(int i) {
    if (acts_[i] == nullptr) {
      acts_[i] = &pool_.acquire();
      acts_[i]->set_shape(mbs_[i].B, mbs_[i].T);
    }
    return *acts_[i];
  }
  // Where micro-batch i's input is received; the first stage receives
  // nothing, and takes no activations for it before its forward.
  float* input(int i) { return pipe_.is_first_stage() ? nullptr : acts(i).input(); }
  float* output(int i) { return model_.stage_output(acts(i)); }
  std::size_t elements(int i) const { return static_cast<std::size_t>(mbs_[i].B) * mbs_[i].T; }
  std::size_t count(int i) const { return elements(i) * model_.config().n_embd; }

  void check_micro_batches(bool training) const {
    if (mbs_.empty()) throw InvalidUsage("a pipeline step needs at least one micro-batch");
    for (const MicroBatch& mb : mbs_) {
      if (pipe_.is_first_stage() && mb.tokens == nullptr) {
        throw InvalidUsage("the first pipeline stage needs every micro-batch's tokens");
      }
      if (training && pipe_.is_last_stage() && mb.targets == nullptr) {
        throw InvalidUsage("the last pipeline stage needs every micro-batch's targets");
      }
    }
  }

  Gpt& model_;
  PipeComm& pipe_;
  ActivationPool& pool_;
  std::span<const MicroBatch> mbs_;
  float dloss_;
  const PipelineCallbacks& callbacks_;
  std::vector<Activations*> acts_;
  bool windowed_;
  Clock::time_point window_start_;
  std::chrono::duration<double> idle_start_{};
  Clock::duration busy_{};
  PipelineStats stats_;
};

void check_stage(const Gpt& model, const PipeComm& pipe) {
  const ModelLayout& l = model.layout();
  if (l.pp_is_first_stage != pipe.is_first_stage() || l.pp_is_last_stage != pipe.is_last_stage()) {
    throw InvalidUsage("the model's layout (first stage " + std::to_string(l.pp_is_first_stage) +
                       ", last stage " + std::to_string(l.pp_is_last_stage) + ") does not match its place " +
                       std::to_string(pipe.stage()) + " of " + std::to_string(pipe.stages()) +
                       " in the PP group; build the layout with mesh_model_layout");
  }
}

}  // namespace

PipelineStats pp_schedule_gpipe(Gpt& model, PipeComm& pipe, ActivationPool& pool,
                                std::span<const MicroBatch> micro_batches, float dloss,
                                const PipelineCallbacks& callbacks) {
  check_stage(model, pipe);
  Stage s(model, pipe, pool, micro_batches, dloss, callbacks, true);
  const int M = s.micro_batches();
  // All forwards: every micro-batch's activations stay until its backward.
  for (int i = 0; i < M; ++i) {
    s.recv_forward(i);
    s.forward(i);
    s.send_forward(i);
  }
  // All backwards, in the same order, so every link sees the same sequence.
  for (int i = 0; i < M; ++i) {
    s.recv_backward(i);
    s.backward(i);
    s.send_backward(i);
  }
  return s.finish();
}

PipelineStats pp_schedule_1f1b(Gpt& model, PipeComm& pipe, ActivationPool& pool,
                               std::span<const MicroBatch> micro_batches, float dloss,
                               const PipelineCallbacks& callbacks) {
  check_stage(model, pipe);
  Stage s(model, pipe, pool, micro_batches, dloss, callbacks, true);
  const int M = s.micro_batches();
  const int warmup = std::min(pipe.stages() - pipe.stage() - 1, M);
  const int steady = M - warmup;

  // Warm-up: forwards only, until the last stage has its first micro-batch.
  for (int i = 0; i < warmup; ++i) {
    s.recv_forward(i);
    s.forward(i);
    s.send_forward(i);
  }
  // Steady state: forward micro-batch warmup + i, then backward micro-batch i.
  if (steady > 0) s.recv_forward(warmup);
  for (int i = 0; i < steady; ++i) {
    const int f = warmup + i;
    s.forward(f);
    s.send_forward_recv_backward(f, i);
    s.backward(i);
    if (i + 1 < steady) {
      s.send_backward_recv_forward(i, f + 1);
    } else {
      s.send_backward(i);
    }
  }
  // Cool-down: the backwards of the warm-up micro-batches.
  for (int i = steady; i < M; ++i) {
    s.recv_backward(i);
    s.backward(i);
    s.send_backward(i);
  }
  return s.finish();
}

PipelineStats pp_forward_only(Gpt& model, PipeComm& pipe, ActivationPool& pool,
                              std::span<const MicroBatch> micro_batches) {
  check_stage(model, pipe);
  const PipelineCallbacks none;
  Stage s(model, pipe, pool, micro_batches, 0.0f, none, false);
  for (int i = 0; i < s.micro_batches(); ++i) {
    s.recv_forward(i);
    s.forward(i);
    s.send_forward(i);
    s.release(i);
  }
  return s.finish();
}

std::string_view pp_schedule_name(PpSchedule schedule) {
  return schedule == PpSchedule::kGpipe ? "gpipe" : "1f1b";
}

PpSchedule parse_pp_schedule(std::string_view text) {
  if (text == "gpipe") return PpSchedule::kGpipe;
  if (text == "1f1b") return PpSchedule::k1f1b;
  throw InvalidUsage("unknown pipeline schedule '" + std::string(text) + "'; choose gpipe or 1f1b");
}

PipelineStats run_pp_schedule(PpSchedule schedule, Gpt& model, PipeComm& pipe, ActivationPool& pool,
                              std::span<const MicroBatch> micro_batches, float dloss,
                              const PipelineCallbacks& callbacks) {
  return schedule == PpSchedule::kGpipe ? pp_schedule_gpipe(model, pipe, pool, micro_batches, dloss, callbacks)
                                        : pp_schedule_1f1b(model, pipe, pool, micro_batches, dloss, callbacks);
}

}  // namespace braid::trainer
