// AdamW with decoupled weight decay, the learning-rate schedule and gradient
// clipping by global norm.
//
// The optimizer state (m, v) covers one Range of the flat parameter buffer:
// the whole buffer for a single process, this rank's shard for ZeRO. An
// update walks the ParamViews that intersect the range and decays only the
// views whose table field `decay` is set (2-D weights and embeddings).
#pragma once

#include <span>

#include "trainer/model/flat_buffer.h"
#include "trainer/model/param_table.h"

namespace braid::trainer {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

class AdamW {
 public:
  AdamW(const ParamTable& table, Range owned, const AdamWConfig& config, MemoryAccount* account);

  // One step over the owned range: params and grads are the FULL flat
  // buffers (only `owned` is read and written). `step` counts from 1.
  void update(std::span<float> params, std::span<const float> grads, float lr, long step);

  Range owned() const { return owned_; }
  // m and v of the owned range, offset by owned().offset.
  FlatBuffer& m() { return m_; }
  FlatBuffer& v() { return v_; }
  const FlatBuffer& m() const { return m_; }
  const FlatBuffer& v() const { return v_; }

 private:
  const ParamTable& table_;
  Range owned_;
  AdamWConfig config_;
  FlatBuffer m_;
  FlatBuffer v_;
};

// Linear warmup from lr/warmup to lr over `warmup_steps`, then cosine decay
// to min_lr at step `steps` (steps count from 0):
//   s < W:  lr * (s + 1) / W
//   s >= W: min_lr + (lr - min_lr) * (1 + cos(pi * (s - W) / max(1, S - W))) / 2
struct LrSchedule {
  float lr = 1e-3f;
  float min_lr = 1e-4f;
  long warmup_steps = 0;
  long steps = 1;

  float at(long step) const;
};

// Sum of squares of `grads`, in double (a strategy adds the shards' sums).
double grad_square_sum(std::span<const float> grads);
// Scales grads by max_norm / norm when norm > max_norm (max_norm <= 0:
// never). Returns the scale applied.
float clip_grads(std::span<float> grads, double norm, float max_norm);

}  // namespace braid::trainer
