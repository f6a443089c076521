// The shape of the GPT and the part of it this rank holds.
//
// GptConfig uses nanoGPT's GPTConfig keys. ModelLayout is everything the
// model knows about parallelism (DESIGN.md "A strategy is the only place
// that knows how ranks cooperate"): its tensor-parallel rank and size, and
// the pipeline stage's block range plus whether it holds the embedding and
// the head. With tp_size 1 and one stage it is the whole model.
#pragma once

#include <string>

namespace braid::trainer {

// The largest n_embd (validate() below says why).
inline constexpr int kMaxNEmbd = 16384;

struct GptConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int block_size = 128;  // longest sequence T; rows of wpe
  int vocab_size = 256;  // byte-level: every byte is a token

  int head_size() const { return n_embd / n_head; }
  bool operator==(const GptConfig&) const = default;
};

// "n_layer 4, n_head 4, n_embd 128, block_size 128, vocab_size 256".
std::string describe(const GptConfig& config);

// Tensor parallel (Megatron-LM): this rank holds heads
// [tp_rank * NH / tp_size, (tp_rank + 1) * NH / tp_size), the matching rows of
// c_attn (separately within q, k and v) and of c_fc (column parallel), and
// the matching columns of both c_proj weights (row parallel). Embeddings,
// layer norms, c_proj biases and the head are replicated.
//
// Pipeline parallel: this stage runs blocks [pp_first_layer, pp_last_layer).
// The first stage also embeds tokens (wte, wpe); the last stage also holds
// ln_f and the LM head (which reads wte: a last stage that is not also the
// first holds its own copy of wte, whose gradient the PP strategy must sum
// with the first stage's).
struct ModelLayout {
  int tp_rank = 0;
  int tp_size = 1;
  int pp_first_layer = 0;
  int pp_last_layer = 0;
  bool pp_is_first_stage = true;
  bool pp_is_last_stage = true;

  // The whole model on one rank.
  static ModelLayout whole(const GptConfig& config);
  int local_heads(const GptConfig& config) const { return config.n_head / tp_size; }
  int local_embd(const GptConfig& config) const { return config.n_embd / tp_size; }
};

// Throws InvalidUsage saying what to change when the config or the layout is
// not a valid GPT (n_embd not divisible by n_head, a layer range outside
// [0, n_layer), heads not divisible by tp_size, ...).
void validate(const GptConfig& config);
void validate(const GptConfig& config, const ModelLayout& layout);

}  // namespace braid::trainer
