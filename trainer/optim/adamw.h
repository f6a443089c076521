// AdamW with decoupled weight decay, the learning-rate schedule and gradient
// clipping by global norm.
//
// The optimizer state (m, v) covers the Ranges of the flat parameter buffer
// this rank owns: the whole buffer for a single process, this rank's chunk
// of every ZeRO group for ZeRO, nothing on a DP worker. m and v hold the
// owned pieces back to back, in the order given. An update walks the
// ParamViews that intersect a piece and decays only the views whose table
// field `decay` is set (2-D weights and embeddings).
#pragma once

#include <span>
#include <vector>

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
  // m and v live on `device`, like the parameters and gradients updated.
  AdamW(const ParamTable& table, std::vector<Range> owned, const AdamWConfig& config, MemoryAccount* account,
        Device device = Device::kCpu);
  AdamW(const ParamTable& table, Range owned, const AdamWConfig& config, MemoryAccount* account,
        Device device = Device::kCpu)
      : AdamW(table, std::vector<Range>{owned}, config, account, device) {}

  // One step over every owned piece: params and grads are the FULL flat
  // buffers (only the owned pieces are read and written). `step` counts
  // from 1.
  void update(std::span<float> params, std::span<const float> grads, float lr, long step);
  // One step over owned piece `piece` alone; params and grads point at the
  // piece's first element wherever the strategy keeps it (a shard buffer).
  void update_piece(std::size_t piece, float* params, const float* grads, float lr, long step);

  const std::vector<Range>& owned() const { return owned_; }
  // Where piece i's m and v start in m() and v().
  std::size_t state_offset(std::size_t piece) const { return state_offsets_[piece]; }
  // m and v of the owned pieces, back to back.
  FlatBuffer& m() { return m_; }
  FlatBuffer& v() { return v_; }
  const FlatBuffer& m() const { return m_; }
  const FlatBuffer& v() const { return v_; }

 private:
  const ParamTable& table_;
  std::vector<Range> owned_;
  std::vector<std::size_t> state_offsets_;
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

// Sum of squares of `grads`, in double (a strategy adds the shards' sums);
// `grads` is in `on`'s memory.
double grad_square_sum(std::span<const float> grads, const Backend& on = backend(Device::kCpu));
// Scales grads by max_norm / norm when norm > max_norm (max_norm <= 0:
// never). Returns the scale applied.
float clip_grads(std::span<float> grads, double norm, float max_norm, const Backend& on = backend(Device::kCpu));

}  // namespace braid::trainer
