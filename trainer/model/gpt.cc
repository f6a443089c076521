// Forward and backward of the GPT, block by block.
//
// Dimensions: B batch, T sequence, C n_embd, Cl = C / tp_size, NHl heads of
// this TP rank, HS head size, V vocabulary, N = B*T.
//
// Backward runs the residual stream's gradient acts.dresidual() down through
// the blocks IN PLACE: it enters a block holding dL/d(output); the MLP
// branch reads it, then ln_2's backward adds its part, which makes it
// dL/d(residual_2); the attention branch reads that and ln_1's backward adds
// its part, which makes it dL/d(input). The skip connections cost nothing.
#include "trainer/model/gpt.h"

#include <algorithm>
#include <vector>

#include "runtime/errors.h"
#include "trainer/model/init.h"

namespace braid::trainer {

Gpt::Gpt(const GptConfig& config, const ModelLayout& layout, MemoryAccount* account, ModelStorage storage)
    : config_(config),
      layout_(layout),
      table_(ParamTable::gpt(config, layout, storage.unit_multiple)),
      account_(account),
      device_(storage.device),
      k_(&trainer::backend(storage.device)),
      params_(storage.params ? allocate(storage.params_in, MemoryCategory::kParameters) : FlatBuffer()),
      grads_(storage.grads ? allocate(storage.grads_in, MemoryCategory::kGradients) : FlatBuffer()) {}

FlatBuffer Gpt::allocate(const ModelStorage::Allocate& in, MemoryCategory category) const {
  if (in) return in(table_.count(), category, account_);
  return FlatBuffer(table_.count(), category, account_, device_);
}

void Gpt::init(std::uint64_t seed) {
  if (params_.count() != table_.count()) {
    throw InvalidUsage("this model keeps no parameter buffer of its own; its strategy initialises the shards");
  }
  if (device_ == Device::kCpu) return init_parameters(config_, layout_, table_, params_.span(), seed);
  std::vector<float> values(table_.count());
  init_parameters(config_, layout_, table_, values, seed);
  k_->from_host(params_.data(), values.data(), values.size() * sizeof(float));
}

void Gpt::set_hooks(ModelHooks* hooks) { hooks_ = hooks != nullptr ? hooks : &no_hooks_; }

Activations Gpt::make_activations(int B, int T) const {
  return Activations(config_, layout_, B, T, account_, device_);
}

float* Gpt::unit_base(Buffer buffer, int unit) {
  float* lent = buffer == Buffer::kParams ? hooks_->unit_params(unit) : hooks_->unit_grads(unit);
  if (lent != nullptr) return lent;
  FlatBuffer& own = buffer == Buffer::kParams ? params_ : grads_;
  if (own.count() == 0) {
    throw InvalidUsage("unit " + table_.units()[unit].name + " has no " +
                       (buffer == Buffer::kParams ? "parameters" : "gradients") +
                       ": this model keeps no such buffer and its hooks lent none");
  }
  return own.data() + table_.units()[unit].range.offset;
}

float* Gpt::tensor(Buffer buffer, const ParamView& view) {
  return unit_base(buffer, view.unit) + (view.offset - table_.units()[view.unit].range.offset);
}

Gpt::BlockTensors Gpt::block_tensors(Buffer buffer, int layer) {
  const std::string h = "h." + std::to_string(layer) + ".";
  const int u = table_.block_unit(layer);
  float* base = unit_base(buffer, u);
  const std::size_t first = table_.units()[u].range.offset;
  auto at = [&](const char* suffix) { return base + (table_.find(h + suffix).offset - first); };
  return BlockTensors{at("ln_1.weight"), at("ln_1.bias"), at("attn.c_attn.weight"), at("attn.c_attn.bias"),
                      at("attn.c_proj.weight"), at("attn.c_proj.bias"), at("ln_2.weight"), at("ln_2.bias"),
                      at("mlp.c_fc.weight"), at("mlp.c_fc.bias"), at("mlp.c_proj.weight"), at("mlp.c_proj.bias")};
}

float* Gpt::block_input(Activations& acts, int layer) const {
  return layer == layout_.pp_first_layer ? acts.input() : acts.block(layer - 1).output;
}

float* Gpt::stage_output(Activations& acts) const {
  return layout_.pp_last_layer > layout_.pp_first_layer ? acts.block(layout_.pp_last_layer - 1).output
                                                        : acts.input();
}

double Gpt::scratch_float_count(const GptConfig& c, const ModelLayout& l, double N) {
  return N * c.n_embd + 12 * N * l.local_embd(c);
}

void Gpt::ensure_scratch(std::size_t N) {
  if (N <= scratch_N_) return;
  const auto count = static_cast<std::size_t>(scratch_float_count(config_, layout_, static_cast<double>(N)));
  scratch_ = FlatBuffer(count, MemoryCategory::kActivations, account_, device_);
  scratch_N_ = N;
}

void Gpt::check_hooks() const {
  if (layout_.tp_size > 1 && hooks_ == &no_hooks_) {
    throw InvalidUsage("a tensor-parallel model (tp_size " + std::to_string(layout_.tp_size) +
                       ") needs hooks that all-reduce over its TP group; call set_hooks first");
  }
}

float Gpt::forward(Activations& acts, const std::int32_t* tokens, const std::int32_t* targets) {
  if (layout_.pp_is_first_stage) forward_embedding(acts, tokens);
  for (int l = layout_.pp_first_layer; l < layout_.pp_last_layer; ++l) forward_block(acts, l);
  return layout_.pp_is_last_stage ? forward_head(acts, targets) : 0.0f;
}

void Gpt::backward(Activations& acts, float dloss) {
  if (layout_.pp_is_last_stage) backward_head(acts, dloss);
  for (int l = layout_.pp_last_layer - 1; l >= layout_.pp_first_layer; --l) backward_block(acts, l);
  if (layout_.pp_is_first_stage) backward_embedding(acts);
}

void Gpt::forward_embedding(Activations& acts, const std::int32_t* tokens) {
  const int B = acts.B(), T = acts.T(), C = config_.n_embd;
  const std::size_t N = static_cast<std::size_t>(B) * T;
  for (std::size_t i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      throw InvalidUsage("token " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                         std::to_string(config_.vocab_size) + ")");
    }
  }
  k_->from_host(acts.tokens(), tokens, N * sizeof(std::int32_t));
  const int u = table_.embedding_unit();
  hooks_->before_unit(u, Pass::kForward);
  const Buffer p = Buffer::kParams;
  k_->embedding_forward(acts.input(), acts.tokens(), tensor(p, "wte.weight"), tensor(p, "wpe.weight"), B, T, C);
  hooks_->after_unit(u, Pass::kForward);
}

void Gpt::forward_block(Activations& acts, int layer) {
  check_hooks();
  const int B = acts.B(), T = acts.T(), C = config_.n_embd;
  const int Cl = layout_.local_embd(config_), NHl = layout_.local_heads(config_), HS = config_.head_size();
  const int N = B * T;
  const int u = table_.block_unit(layer);
  hooks_->before_unit(u, Pass::kForward);
  BlockTensors w = block_tensors(Buffer::kParams, layer);
  BlockActivations a = acts.block(layer);
  const float* x = block_input(acts, layer);
  float* proj = acts.proj();
  // A row-parallel c_proj adds its (replicated) bias on one TP rank only,
  // so the sum over the group holds it once.
  const bool add_proj_bias = layout_.tp_rank == 0;

  k_->layernorm_forward(a.ln_1, a.ln_1_mean, a.ln_1_rstd, x, w.ln_1_w, w.ln_1_b, N, C);
  k_->matmul_forward(a.qkv, a.ln_1, w.attn_w, w.attn_b, N, C, 3 * Cl);              // [N, 3Cl]
  k_->attention_forward(a.atty, a.att, a.qkv, B, T, NHl, HS);                        // [N, Cl]
  k_->matmul_forward(proj, a.atty, w.attn_proj_w, add_proj_bias ? w.attn_proj_b : nullptr, N, Cl, C);
  if (layout_.tp_size > 1) hooks_->tp_all_reduce_forward(proj, static_cast<std::size_t>(N) * C);
  k_->add(a.residual_2, x, proj, static_cast<std::size_t>(N) * C);

  k_->layernorm_forward(a.ln_2, a.ln_2_mean, a.ln_2_rstd, a.residual_2, w.ln_2_w, w.ln_2_b, N, C);
  k_->matmul_forward(a.fch, a.ln_2, w.fc_w, w.fc_b, N, C, 4 * Cl);                  // [N, 4Cl]
  k_->gelu_forward(a.fch_gelu, a.fch, static_cast<std::size_t>(N) * 4 * Cl);
  k_->matmul_forward(proj, a.fch_gelu, w.mlp_proj_w, add_proj_bias ? w.mlp_proj_b : nullptr, N, 4 * Cl, C);
  if (layout_.tp_size > 1) hooks_->tp_all_reduce_forward(proj, static_cast<std::size_t>(N) * C);
  k_->add(a.output, a.residual_2, proj, static_cast<std::size_t>(N) * C);
  hooks_->after_unit(u, Pass::kForward);
}

float Gpt::forward_head(Activations& acts, const std::int32_t* targets) {
  const int N = acts.B() * acts.T(), C = config_.n_embd, V = config_.vocab_size;
  const int u = table_.head_unit(), e = table_.embedding_unit();
  hooks_->before_unit(u, Pass::kForward);
  if (e >= 0) hooks_->before_unit(e, Pass::kForward);  // the tied wte lives there
  const Buffer p = Buffer::kParams;
  HeadActivations h = acts.head();
  k_->layernorm_forward(h.ln_f, h.ln_f_mean, h.ln_f_rstd, stage_output(acts), tensor(p, "ln_f.weight"),
                         tensor(p, "ln_f.bias"), N, C);
  k_->matmul_forward(h.logits, h.ln_f, tensor(p, "wte.weight"), nullptr, N, C, V);  // [N, V]
  if (e >= 0) hooks_->after_unit(e, Pass::kForward);
  hooks_->after_unit(u, Pass::kForward);
  if (targets == nullptr) return 0.0f;
  for (int i = 0; i < N; ++i) {
    if (targets[i] < 0 || targets[i] >= V) {
      throw InvalidUsage("target " + std::to_string(targets[i]) + " is outside the vocabulary [0, " +
                         std::to_string(V) + ")");
    }
  }
  k_->from_host(acts.targets(), targets, static_cast<std::size_t>(N) * sizeof(std::int32_t));
  k_->crossentropy_forward(h.losses, h.probs, h.logits, acts.targets(), N, V);
  std::vector<float> losses(N);
  k_->to_host(losses.data(), h.losses, losses.size() * sizeof(float));
  double sum = 0.0;
  for (float loss : losses) sum += loss;
  return static_cast<float>(sum / N);
}

void Gpt::backward_head(Activations& acts, float dloss) {
  const int N = acts.B() * acts.T(), C = config_.n_embd, V = config_.vocab_size;
  const int u = table_.head_unit(), e = table_.embedding_unit();
  ensure_scratch(static_cast<std::size_t>(N));
  hooks_->before_unit(u, Pass::kBackward);
  if (e >= 0) hooks_->before_unit(e, Pass::kBackward);
  const Buffer p = Buffer::kParams, g = Buffer::kGrads;
  HeadActivations h = acts.head();
  float* dlogits = h.logits;  // logits are not needed any more
  float* dln_f = scratch_.data();
  k_->fill(h.dlosses, dloss, N);
  zero(dlogits, static_cast<std::size_t>(N) * V);
  k_->crossentropy_backward(dlogits, h.probs, acts.targets(), h.dlosses, N, V);
  zero(dln_f, static_cast<std::size_t>(N) * C);
  k_->matmul_backward(dln_f, tensor(g, "wte.weight"), nullptr, dlogits, h.ln_f, tensor(p, "wte.weight"), N, C, V);
  zero(acts.dresidual(), static_cast<std::size_t>(N) * C);
  k_->layernorm_backward(acts.dresidual(), tensor(g, "ln_f.weight"), tensor(g, "ln_f.bias"), dln_f,
                          stage_output(acts), tensor(p, "ln_f.weight"), h.ln_f_mean, h.ln_f_rstd, N, C);
  if (e >= 0) hooks_->after_unit(e, Pass::kBackward);
  hooks_->after_unit(u, Pass::kBackward);
  hooks_->grads_ready(u, table_.units()[u].range);
}

void Gpt::mlp_backward(Activations& acts, int layer, const BlockTensors& w, const BlockTensors& g) {
  const int N = acts.B() * acts.T(), C = config_.n_embd, Cl = layout_.local_embd(config_);
  const std::size_t NC = static_cast<std::size_t>(N) * C, NCl = static_cast<std::size_t>(N) * Cl;
  BlockActivations a = acts.block(layer);
  float* d = acts.dresidual();
  float* dln = scratch_.data();
  float* dfch = dln + NC + 4 * NCl;
  float* dfch_gelu = dfch + 4 * NCl;
  zero(dfch_gelu, 4 * NCl);
  k_->matmul_backward(dfch_gelu, g.mlp_proj_w, g.mlp_proj_b, d, a.fch_gelu, w.mlp_proj_w, N, 4 * Cl, C);
  zero(dfch, 4 * NCl);
  k_->gelu_backward(dfch, a.fch, dfch_gelu, 4 * NCl);
  zero(dln, NC);
  k_->matmul_backward(dln, g.fc_w, g.fc_b, dfch, a.ln_2, w.fc_w, N, C, 4 * Cl);
  if (layout_.tp_size > 1) hooks_->tp_all_reduce_backward(dln, NC);
  k_->layernorm_backward(d, g.ln_2_w, g.ln_2_b, dln, a.residual_2, w.ln_2_w, a.ln_2_mean, a.ln_2_rstd, N, C);
}

void Gpt::attention_branch_backward(Activations& acts, int layer, const BlockTensors& w,
                                    const BlockTensors& g) {
  const int B = acts.B(), T = acts.T(), N = B * T, C = config_.n_embd;
  const int Cl = layout_.local_embd(config_), NHl = layout_.local_heads(config_), HS = config_.head_size();
  const std::size_t NC = static_cast<std::size_t>(N) * C, NCl = static_cast<std::size_t>(N) * Cl;
  BlockActivations a = acts.block(layer);
  float* d = acts.dresidual();
  float* dln = scratch_.data();
  float* dqkv = dln + NC;
  float* datty = dqkv + 3 * NCl;
  zero(datty, NCl);
  k_->matmul_backward(datty, g.attn_proj_w, g.attn_proj_b, d, a.atty, w.attn_proj_w, N, Cl, C);
  zero(dqkv, 3 * NCl);
  k_->attention_backward(dqkv, datty, a.qkv, a.att, B, T, NHl, HS);
  zero(dln, NC);
  k_->matmul_backward(dln, g.attn_w, g.attn_b, dqkv, a.ln_1, w.attn_w, N, C, 3 * Cl);
  if (layout_.tp_size > 1) hooks_->tp_all_reduce_backward(dln, NC);
  k_->layernorm_backward(d, g.ln_1_w, g.ln_1_b, dln, block_input(acts, layer), w.ln_1_w, a.ln_1_mean,
                          a.ln_1_rstd, N, C);
}

void Gpt::backward_block(Activations& acts, int layer) {
  check_hooks();
  ensure_scratch(static_cast<std::size_t>(acts.B()) * acts.T());
  const int u = table_.block_unit(layer);
  hooks_->before_unit(u, Pass::kBackward);
  BlockTensors w = block_tensors(Buffer::kParams, layer);
  BlockTensors g = block_tensors(Buffer::kGrads, layer);
  mlp_backward(acts, layer, w, g);
  attention_branch_backward(acts, layer, w, g);
  hooks_->after_unit(u, Pass::kBackward);
  hooks_->grads_ready(u, table_.units()[u].range);
}

void Gpt::backward_embedding(Activations& acts) {
  const int u = table_.embedding_unit();
  hooks_->before_unit(u, Pass::kBackward);
  const Buffer g = Buffer::kGrads;
  k_->embedding_backward(tensor(g, "wte.weight"), tensor(g, "wpe.weight"), acts.dresidual(), acts.tokens(),
                          acts.B(), acts.T(), config_.n_embd);
  hooks_->after_unit(u, Pass::kBackward);
  hooks_->grads_ready(u, table_.units()[u].range);
}

}  // namespace braid::trainer
