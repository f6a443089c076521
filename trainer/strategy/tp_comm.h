// Tensor parallelism's communication: Megatron-LM's conjugate operators f
// and g (Shoeybi et al. 2019, section 3) over a TP group.
//
//   f  in front of a column-parallel layer (c_attn, c_fc). Forward: the
//      identity (every rank already holds the whole input X). Backward:
//      each rank's slice of the layer gives only its part of dL/dX, so the
//      parts are all-reduced (summed).
//   g  behind a row-parallel layer (both c_proj). Forward: each rank's
//      slice gives a partial sum of the output, so the partials are
//      all-reduced. Backward: the identity (every rank needs all of dL/dY).
//
// So a block is  x + g(attn(f(ln_1(x))) W_proj,r)  then the same with the
// MLP: two all-reduces of [B*T, C] floats forward, two backward, per block
// and micro-batch. The model calls g and f's backward through its hooks
// (ModelHooks::tp_all_reduce_forward / tp_all_reduce_backward); TpHooks is
// the adapter. Replicated tensors (layer norms, c_proj biases, embeddings,
// head) get identical gradients on every TP rank, so TP itself reduces no
// gradient: a DP strategy on top reduces over its DP group only.
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

#include "comm/communicator.h"
#include "trainer/model/hooks.h"
#include "trainer/model/param_table.h"
#include "trainer/strategy/comm_meter.h"

namespace braid::trainer {

// f: identity forward, all-reduce backward. In place on `count` floats.
inline void tp_f_forward(comm::Communicator& /*tp_group*/, float* /*x*/, std::size_t /*count*/) {}
void tp_f_backward(comm::Communicator& tp_group, float* dx, std::size_t count);
// g: all-reduce forward, identity backward. In place on `count` floats.
void tp_g_forward(comm::Communicator& tp_group, float* x, std::size_t count);
inline void tp_g_backward(comm::Communicator& /*tp_group*/, float* /*dx*/, std::size_t /*count*/) {}

// The output of a column-parallel layer, whole: every rank's [rows,
// local_cols] side by side into full [rows, tp_size * local_cols], rank r's
// columns at [r * local_cols, (r + 1) * local_cols). Collective.
void tp_gather_columns(comm::Communicator& tp_group, const float* local, float* full, std::size_t rows,
                       std::size_t local_cols);

// The inverse of copy_tp_part: writes rank `tp_rank`'s part `local` of
// tensor `view` into `full` (row-major, view.full_shape).
void place_tp_part(const ParamView& view, int tp_rank, int tp_size, const float* local, float* full);

// The whole tensor (view.full_shape) from every TP rank's part `local`.
// Collective over the TP group for split tensors; a replicated tensor is
// copied from `local` without communication.
std::vector<float> tp_gather_tensor(comm::Communicator& tp_group, const ParamView& view, const float* local);

// The model's hooks for tensor parallelism: tp_all_reduce_forward is g,
// tp_all_reduce_backward is f's backward, both over `tp_group`; every other
// hook goes to `inner` (the data-parallel strategy, or null for none).
// Install with model.set_hooks(&tp_hooks) after the strategy has set its own.
class TpHooks : public ModelHooks {
 public:
  explicit TpHooks(comm::Communicator& tp_group, ModelHooks* inner = nullptr);

  void before_unit(int unit, Pass pass) override;
  void after_unit(int unit, Pass pass) override;
  void grads_ready(int unit, Range grads) override;
  float* unit_params(int unit) override;
  float* unit_grads(int unit) override;
  void tp_all_reduce_forward(float* x, std::size_t count) override;
  void tp_all_reduce_backward(float* dx, std::size_t count) override;

  // Floats all-reduced by g (forward) and f (backward) since construction.
  std::size_t forward_count() const { return forward_count_; }
  std::size_t backward_count() const { return backward_count_; }
  // The TP group's meter: time blocked in g and f, their bus bytes, and the
  // other sums over the TP group a step makes through it (the mesh's
  // gradient norm).
  CommMeter& meter() { return meter_; }
  const CommMeter& meter() const { return meter_; }
  std::chrono::duration<double> blocked() const { return meter_.blocked(); }

 private:
  void all_reduce(float* x, std::size_t count);

  CommMeter meter_;
  ModelHooks no_inner_;
  ModelHooks* inner_;
  std::size_t forward_count_ = 0;
  std::size_t backward_count_ = 0;
};

}  // namespace braid::trainer
