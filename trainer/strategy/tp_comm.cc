// f, g and the gathers of tensor-parallel parts.
//
// Split tensors follow ParamTable: a column-parallel tensor is cut along
// dim 0 within each of its tp_groups (c_attn: q, k and v separately, so
// each rank keeps whole heads), a row-parallel weight along dim 1.
#include "trainer/strategy/tp_comm.h"

#include <cstring>

namespace braid::trainer {

namespace {

void all_reduce_sum(comm::Communicator& group, float* x, std::size_t count) {
  if (group.size() == 1) return;
  group.all_reduce(x, x, count, DataType::f32, ReduceOp::sum).wait();
}

std::size_t full_count(const ParamView& view) {
  std::size_t n = 1;
  for (auto d : view.full_shape) n *= static_cast<std::size_t>(d);
  return n;
}

}  // namespace

void tp_f_backward(comm::Communicator& tp_group, float* dx, std::size_t count) {
  all_reduce_sum(tp_group, dx, count);
}

void tp_g_forward(comm::Communicator& tp_group, float* x, std::size_t count) {
  all_reduce_sum(tp_group, x, count);
}

void tp_gather_columns(comm::Communicator& tp_group, const float* local, float* full, std::size_t rows,
                       std::size_t local_cols) {
  const std::size_t R = static_cast<std::size_t>(tp_group.size()), part = rows * local_cols;
  std::vector<float> parts(R * part);  // [R][rows][local_cols]
  tp_group.all_gather(local, parts.data(), part, DataType::f32).wait();
  for (std::size_t r = 0; r < R; ++r) {
    for (std::size_t i = 0; i < rows; ++i) {
      std::memcpy(full + i * R * local_cols + r * local_cols, parts.data() + r * part + i * local_cols,
                  local_cols * sizeof(float));
    }
  }
}

void place_tp_part(const ParamView& v, int tp_rank, int tp_size, const float* local, float* full) {
  if (v.tp_split == TpSplit::kReplicated || tp_size == 1) {
    std::memcpy(full, local, v.count() * sizeof(float));
    return;
  }
  const std::int64_t cols = v.full_shape.size() == 2 ? v.full_shape[1] : 1;
  if (v.tp_split == TpSplit::kColumnParallel) {
    // Group g's rows [g*R + tp_rank*r, g*R + (tp_rank+1)*r) come from local rows [g*r, (g+1)*r).
    const std::int64_t R = v.full_shape[0] / v.tp_groups, r = R / tp_size;
    for (int g = 0; g < v.tp_groups; ++g) {
      std::memcpy(full + (g * R + tp_rank * r) * cols, local + g * r * cols,
                  static_cast<std::size_t>(r * cols) * sizeof(float));
    }
    return;
  }
  // Row parallel: columns [tp_rank*c, (tp_rank+1)*c) of every row.
  const std::int64_t rows = v.full_shape[0], c = cols / tp_size;
  for (std::int64_t i = 0; i < rows; ++i) {
    std::memcpy(full + i * cols + tp_rank * c, local + i * c, static_cast<std::size_t>(c) * sizeof(float));
  }
}

std::vector<float> tp_gather_tensor(comm::Communicator& tp_group, const ParamView& view, const float* local) {
  std::vector<float> full(full_count(view));
  const int T = tp_group.size();
  if (view.tp_split == TpSplit::kReplicated || T == 1) {
    std::memcpy(full.data(), local, view.count() * sizeof(float));
    return full;
  }
  std::vector<float> parts(static_cast<std::size_t>(T) * view.count());  // [T][view.count()]
  tp_group.all_gather(local, parts.data(), view.count(), DataType::f32).wait();
  for (int r = 0; r < T; ++r) place_tp_part(view, r, T, parts.data() + r * view.count(), full.data());
  return full;
}

TpHooks::TpHooks(comm::Communicator& tp_group, ModelHooks* inner)
    : meter_(&tp_group), inner_(inner != nullptr ? inner : &no_inner_) {}

void TpHooks::before_unit(int unit, Pass pass) { inner_->before_unit(unit, pass); }
void TpHooks::after_unit(int unit, Pass pass) { inner_->after_unit(unit, pass); }
void TpHooks::grads_ready(int unit, Range grads) { inner_->grads_ready(unit, grads); }
float* TpHooks::unit_params(int unit) { return inner_->unit_params(unit); }
float* TpHooks::unit_grads(int unit) { return inner_->unit_grads(unit); }

// g's forward and f's backward are both this sum over the TP group.
void TpHooks::all_reduce(float* x, std::size_t count) {
  if (meter_.size() == 1) return;
  meter_.run([&](CommMeter::Calls& c) { return c.all_reduce(x, x, count, DataType::f32, ReduceOp::sum); });
}

void TpHooks::tp_all_reduce_forward(float* x, std::size_t count) {
  all_reduce(x, count);
  forward_count_ += count;
}

void TpHooks::tp_all_reduce_backward(float* dx, std::size_t count) {
  all_reduce(dx, count);
  backward_count_ += count;
}

}  // namespace braid::trainer
