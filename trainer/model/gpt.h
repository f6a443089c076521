// A GPT-2 shaped decoder with forward and backward written by hand over the
// ops of kernels/cpu/gpt_ops.h (through the Backend of its device):
//
//   x = wte[tokens] + wpe[t]                       (first stage)
//   per block: x = x + c_proj(attn(c_attn(ln_1(x))))
//              x = x + c_proj(gelu(c_fc(ln_2(x))))
//   logits = ln_f(x) @ wte^T, loss = cross-entropy  (last stage)
//
// Parameters and gradients are flat buffers described by table(), on the
// model's Device; every op runs through that device's Backend. Tokens and
// targets come from the host and are copied in; the loss goes back. The model
// knows its TP rank/size and PP layer range (ModelLayout) and nothing more;
// a strategy drives it through the stage pieces below and the ModelHooks.
// Every backward piece ACCUMULATES into the gradient buffer, so gradient
// accumulation over micro-batches is just calling backward again.
//
// The model finds a unit's parameters and gradients through its hooks
// (ModelHooks::unit_params / unit_grads) and falls back to its own flat
// buffers. A ZeRO strategy builds the model without the buffers it shards
// (ModelStorage) and lends each unit's storage only while the unit is used.
#pragma once

#include <cstdint>
#include <functional>

#include "trainer/model/activations.h"
#include "trainer/model/flat_buffer.h"
#include "trainer/model/gpt_config.h"
#include "trainer/model/hooks.h"
#include "trainer/model/param_table.h"

namespace braid::trainer {

// Which flat buffers the model allocates, and the padding of its units
// (ParamTable::gpt's unit_multiple).
struct ModelStorage {
  std::size_t unit_multiple = 1;
  bool params = true;  // false: every unit's parameters come from unit_params()
  bool grads = true;   // false: every unit's gradients go to unit_grads()
  Device device = Device::kCpu;  // of every buffer the model allocates
  // Where the parameter and gradient buffers are allocated when set (a
  // strategy's registered memory): moved there after the fact, each was
  // for a moment in memory twice, the run's peak with ZeRO-1.
  using Allocate = std::function<FlatBuffer(std::size_t count, MemoryCategory category, MemoryAccount* account)>;
  Allocate params_in, grads_in;
};

class Gpt {
 public:
  Gpt(const GptConfig& config, const ModelLayout& layout, MemoryAccount* account, ModelStorage storage = {});

  const GptConfig& config() const { return config_; }
  const ModelLayout& layout() const { return layout_; }
  const ParamTable& table() const { return table_; }
  Device device() const { return device_; }
  const Backend& ops() const { return *k_; }
  FlatBuffer& params() { return params_; }
  const FlatBuffer& params() const { return params_; }
  FlatBuffer& grads() { return grads_; }
  const FlatBuffer& grads() const { return grads_; }

  // GPT-2 initialisation from `seed` (trainer/model/init.h) of the model's
  // own parameter buffer.
  void init(std::uint64_t seed);
  void zero_grads() { grads_.zero(); }
  // null restores the no-op hooks of the single-process model.
  void set_hooks(ModelHooks* hooks);
  // Activations for micro-batches of up to B sequences of up to T tokens,
  // charged to this model's memory account.
  Activations make_activations(int B, int T) const;
  // Allocates backward's scratch for micro-batches of up to B x T now, so
  // the memory account holds it before the first step.
  void reserve_scratch(int B, int T) { ensure_scratch(static_cast<std::size_t>(B) * T); }
  // The floats of that scratch for N = B x T tokens (train/memory_plan.h).
  static double scratch_float_count(const GptConfig& config, const ModelLayout& layout, double N);

  // The whole stage. forward() embeds `tokens` on the first stage (other
  // stages read acts.input(), set by the strategy, and pass null) and, on
  // the last stage, returns the mean loss over the B*T targets (targets
  // null: logits only, returns 0). backward() seeds every target's loss
  // gradient with `dloss` (e.g. 1 / tokens in the global batch) on the last
  // stage, or starts from acts.dresidual() set by the strategy; on a
  // non-first stage it leaves the gradient of acts.input() in acts.dresidual().
  float forward(Activations& acts, const std::int32_t* tokens, const std::int32_t* targets);
  void backward(Activations& acts, float dloss);

  // Stage pieces, callable separately. acts.set_shape(B, T) before the first.
  void forward_embedding(Activations& acts, const std::int32_t* tokens);  // -> acts.input()
  void forward_block(Activations& acts, int layer);
  float forward_head(Activations& acts, const std::int32_t* targets);
  void backward_head(Activations& acts, float dloss);     // -> acts.dresidual()
  void backward_block(Activations& acts, int layer);      // acts.dresidual() in place
  void backward_embedding(Activations& acts);             // consumes acts.dresidual()

  // Output of the stage's last block ([B, T, C]); acts.input() if none.
  float* stage_output(Activations& acts) const;

 private:
  struct BlockTensors {
    float *ln_1_w, *ln_1_b, *attn_w, *attn_b, *attn_proj_w, *attn_proj_b;
    float *ln_2_w, *ln_2_b, *fc_w, *fc_b, *mlp_proj_w, *mlp_proj_b;
  };
  enum class Buffer { kParams, kGrads };
  FlatBuffer allocate(const ModelStorage::Allocate& in, MemoryCategory category) const;
  float* unit_base(Buffer buffer, int unit);
  float* tensor(Buffer buffer, const ParamView& view);
  float* tensor(Buffer buffer, const std::string& name) { return tensor(buffer, table_.find(name)); }
  BlockTensors block_tensors(Buffer buffer, int layer);
  float* block_input(Activations& acts, int layer) const;
  void ensure_scratch(std::size_t N);
  void check_hooks() const;
  void zero(float* p, std::size_t count) { k_->zero(p, count * sizeof(float)); }
  void mlp_backward(Activations& acts, int layer, const BlockTensors& w, const BlockTensors& g);
  void attention_branch_backward(Activations& acts, int layer, const BlockTensors& w, const BlockTensors& g);

  GptConfig config_;
  ModelLayout layout_;
  ParamTable table_;
  MemoryAccount* account_;
  Device device_;
  const Backend* k_;
  FlatBuffer params_;
  FlatBuffer grads_;
  ModelHooks no_hooks_;
  ModelHooks* hooks_ = &no_hooks_;
  // Backward scratch, shared by all blocks and micro-batches: dln [N, C],
  // dqkv [N, 3Cl], datty [N, Cl], dfch [N, 4Cl], dfch_gelu [N, 4Cl].
  FlatBuffer scratch_;
  std::size_t scratch_N_ = 0;
};

}  // namespace braid::trainer
