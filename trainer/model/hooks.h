// The points where a parallel strategy plugs into the model's passes.
//
// The model does no communication. A strategy derives from ModelHooks and
// overrides what it needs; the defaults do nothing, which is exactly the
// single-process model. The calls, in the order a pass makes them:
//
//   before_unit(u, pass) / after_unit(u, pass)
//       around every use of unit u's parameters (u indexes
//       ParamTable::units()). ZeRO-3 gathers u's parameters in before_unit
//       and frees them in after_unit. The head's pass also announces the
//       embedding unit when it reads the tied wte from there.
//   grads_ready(u, range)
//       during backward, once unit u's gradients in `range` of the flat
//       gradient buffer are complete for this micro-batch. DDP launches the
//       all-reduce of the buckets inside `range` here, overlapping the
//       backward of the units below.
//   unit_params(u) / unit_grads(u)
//       where unit u's parameters / gradients are while the model uses them
//       (a pointer to the unit's first element, padding included), or null
//       for the model's own flat buffer. ZeRO-3 lends its gathered copy of
//       u's parameters here; ZeRO-2 and 3 lend a staging bucket for the
//       gradients, as they keep no full gradient buffer. Asked inside
//       before_unit / after_unit of the same unit, every time it is used.
//   tp_all_reduce_forward(x, count)     Megatron's g: sums the row-parallel
//       c_proj partial outputs over the TP group (identity in backward).
//   tp_all_reduce_backward(dx, count)   Megatron's f: sums the gradient of
//       the column-parallel input (the ln_1 / ln_2 output) over the TP group
//       (identity in forward).
#pragma once

#include <cstddef>

#include "trainer/model/flat_buffer.h"

namespace braid::trainer {

enum class Pass { kForward, kBackward };

class ModelHooks {
 public:
  virtual ~ModelHooks() = default;
  virtual void before_unit(int unit, Pass pass) {}
  virtual void after_unit(int unit, Pass pass) {}
  virtual void grads_ready(int unit, Range grads) {}
  virtual float* unit_params(int unit) { return nullptr; }
  virtual float* unit_grads(int unit) { return nullptr; }
  virtual void tp_all_reduce_forward(float* x, std::size_t count) {}
  virtual void tp_all_reduce_backward(float* dx, std::size_t count) {}
};

}  // namespace braid::trainer
