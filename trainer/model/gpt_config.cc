#include "trainer/model/gpt_config.h"

#include "runtime/errors.h"

namespace braid::trainer {

std::string describe(const GptConfig& c) {
  return "n_layer " + std::to_string(c.n_layer) + ", n_head " + std::to_string(c.n_head) +
         ", n_embd " + std::to_string(c.n_embd) + ", block_size " + std::to_string(c.block_size) +
         ", vocab_size " + std::to_string(c.vocab_size);
}

ModelLayout ModelLayout::whole(const GptConfig& config) {
  return ModelLayout{0, 1, 0, config.n_layer, true, true};
}

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw InvalidUsage(message);
}

}  // namespace

void validate(const GptConfig& c) {
  require(c.n_layer >= 1, "n_layer must be at least 1 (got " + std::to_string(c.n_layer) + ")");
  require(c.n_head >= 1, "n_head must be at least 1 (got " + std::to_string(c.n_head) + ")");
  require(c.n_embd >= 1, "n_embd must be at least 1 (got " + std::to_string(c.n_embd) + ")");
  require(c.n_embd % c.n_head == 0,
          "n_embd " + std::to_string(c.n_embd) + " is not divisible by n_head " +
              std::to_string(c.n_head) + "; choose n_embd a multiple of n_head");
  require(c.block_size >= 1, "block_size must be at least 1 (got " + std::to_string(c.block_size) + ")");
  require(c.vocab_size == 256, "vocab_size must be 256 (byte-level vocabulary)");
  // Kernels index with int: the largest weight, [4C, C], has 2^30 elements
  // at the bound, half of int's range.
  require(c.n_embd <= kMaxNEmbd,
          "n_embd " + std::to_string(c.n_embd) + " is too large; use at most " + std::to_string(kMaxNEmbd));
}

void validate(const GptConfig& c, const ModelLayout& l) {
  validate(c);
  require(l.tp_size >= 1 && l.tp_rank >= 0 && l.tp_rank < l.tp_size,
          "tp_rank " + std::to_string(l.tp_rank) + " is outside [0, tp_size " +
              std::to_string(l.tp_size) + ")");
  require(c.n_head % l.tp_size == 0,
          "n_head " + std::to_string(c.n_head) + " is not divisible by tp_size " +
              std::to_string(l.tp_size) + "; choose a tp_size that divides the heads");
  require(0 <= l.pp_first_layer && l.pp_first_layer <= l.pp_last_layer && l.pp_last_layer <= c.n_layer,
          "pipeline stage layers [" + std::to_string(l.pp_first_layer) + ", " +
              std::to_string(l.pp_last_layer) + ") are not inside [0, n_layer " +
              std::to_string(c.n_layer) + ")");
  require(l.pp_is_first_stage == (l.pp_first_layer == 0),
          "the first pipeline stage (and only it) must start at layer 0");
  require(l.pp_is_last_stage == (l.pp_last_layer == c.n_layer),
          "the last pipeline stage (and only it) must end at layer n_layer");
}

}  // namespace braid::trainer
