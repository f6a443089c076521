// Moving the training state between a strategy's buffers and files: loading
// any checkpoint layout or weights file into whatever this rank holds, and
// writing what it owns. Whole tensors travel one at a time, so a rank never
// holds more of the model than its strategy does, plus one tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "trainer/checkpoint/sharded.h"
#include "trainer/strategy/mesh.h"
#include "trainer/strategy/strategy.h"

namespace braid::trainer {

// Validates every tensor first (nothing changes on a refusal), then loads
// the parameters and, with `optimizer`, AdamW's m and v.
void load_state(const CheckpointReader& reader, const std::filesystem::path& where, Strategy& strategy,
                bool optimizer);

// The pieces of every tensor this rank owns, as a shard file holds them.
std::vector<TensorPiece> owned_pieces(Strategy& strategy);

// A sharded checkpoint of `state.step` under `dir` (collective: every rank
// writes its shard, rank 0 the manifest and `extra` once every shard is on
// disk (write_together.h), then publishes the step). Returns the step
// directory.
std::filesystem::path save_sharded_checkpoint(Strategy& strategy, const std::filesystem::path& dir,
                                              const TrainState& state, const StepFiles& extra = {});

// A checkpoint of a --tp / --pp run (collective over the world). Each
// stage's rank at dp 0, tp 0 writes the stage's tensors whole (gathered over
// DP and TP; wte by the first stage only), the others empty shards, so the
// pieces tile every tensor once and the checkpoint loads into any layout
// and consolidates like any sharded one.
std::filesystem::path save_mesh_checkpoint(Mesh& mesh, comm::Communicator& world, const std::filesystem::path& dir,
                                           const TrainState& state, const StepFiles& extra = {});
// The whole parameters as one safetensors weights file, written by rank 0
// (collective: every rank must call it).
void save_strategy_weights(Strategy& strategy, const std::filesystem::path& path, std::int64_t step);

}  // namespace braid::trainer
