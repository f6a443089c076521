// GPT-2 initialisation (as nanoGPT does it), deterministic from a seed.
//
//   2-D weights and both embeddings   N(0, 0.02)
//   attn.c_proj.weight, mlp.c_proj.weight   N(0, 0.02 / sqrt(2 n_layer))
//   biases 0, LayerNorm weights 1, LayerNorm biases 0
//
// Each tensor draws from its own stream, seeded by hash(seed, name), over
// its WHOLE (tp_size 1) shape in row-major order; a tensor-parallel rank
// keeps its part. So the initial model is the same whatever the layout.
#pragma once

#include <cstdint>
#include <span>

#include "trainer/model/gpt_config.h"
#include "trainer/model/param_table.h"

namespace braid::trainer {

void init_parameters(const GptConfig& config, const ModelLayout& layout, const ParamTable& table,
                     std::span<float> params, std::uint64_t seed);

// One tensor's initial values, this TP rank's part (view.count() elements):
// what init_parameters writes at view.offset. Lets a strategy that keeps
// only shards initialise them one tensor at a time.
void init_view(const GptConfig& config, const ModelLayout& layout, const ParamView& view, std::uint64_t seed,
               float* local);

}  // namespace braid::trainer
