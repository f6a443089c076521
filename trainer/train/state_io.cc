#include "trainer/train/state_io.h"

#include "runtime/errors.h"

namespace braid::trainer {

namespace {

struct SlotKey {
  Slot slot;
  const char* prefix;  // of the tensor keys in checkpoints
};
constexpr SlotKey kParamsOnly[] = {{Slot::kParams, ""}};
constexpr SlotKey kAllSlots[] = {{Slot::kParams, ""}, {Slot::kM, "m."}, {Slot::kV, "v."}};

void barrier(Strategy& strategy) {
  if (strategy.comm() == nullptr) return;
  comm::Work work = strategy.comm()->barrier();
  work.wait();
}

}  // namespace

void load_state(const CheckpointReader& reader, const std::filesystem::path& where, Strategy& strategy,
                bool optimizer) {
  const Gpt& model = strategy.model();
  if (!(reader.config() == model.config())) {
    throw InvalidUsage("checkpoint " + where.string() + " holds a model with " + describe(reader.config()) +
                       ", but this run's model has " + describe(model.config()) + "; pass the checkpoint's sizes");
  }
  const std::span<const SlotKey> slots = optimizer ? std::span<const SlotKey>(kAllSlots) : kParamsOnly;
  for (const SlotKey& s : slots) {
    for (const ParamView& v : model.table().views()) reader.check(s.prefix + v.name, v.full_shape);
  }
  std::vector<float> values;
  for (const SlotKey& s : slots) {
    for (const ParamView& v : model.table().views()) {
      values.resize(v.count());
      reader.read(s.prefix + v.name, v.full_shape, values.data());
      strategy.write_view(s.slot, v, values.data());
    }
  }
}

std::vector<TensorPiece> owned_pieces(Strategy& strategy) {
  std::vector<TensorPiece> pieces;
  for (const SlotKey& s : kAllSlots) {
    for (const Held& h : strategy.owned(s.slot)) {
      for (const ParamView& v : strategy.model().table().views()) {
        const Range r = intersect(h.range, v.range());
        if (r.count == 0) continue;  // padding belongs to no tensor
        pieces.push_back({s.prefix + v.name, r.offset - v.offset, r.count, h.data + (r.offset - h.range.offset)});
      }
    }
  }
  return pieces;
}

std::filesystem::path save_sharded_checkpoint(Strategy& strategy, const std::filesystem::path& dir,
                                              const TrainState& state) {
  const std::filesystem::path step_dir = prepare_step_directory(dir, state.step);
  write_shard(step_dir, strategy.rank(), strategy.world_size(), owned_pieces(strategy), strategy.model().config(),
              state.step);
  // The manifest goes last, once every shard is durable.
  barrier(strategy);
  if (strategy.rank() != 0) return step_dir;
  return commit_sharded_checkpoint(dir, state, strategy.world_size(), std::string(strategy_name(strategy.kind())));
}

void save_strategy_weights(Strategy& strategy, const std::filesystem::path& path, std::int64_t step) {
  const ParamTable& table = strategy.model().table();
  std::vector<std::vector<float>> values;
  std::vector<TensorToWrite> tensors;
  for (const ParamView& v : table.views()) {
    values.push_back(strategy.read_view(Slot::kParams, v));
    tensors.push_back({v.name, v.full_shape, values.back().data()});
  }
  if (strategy.rank() == 0) write_safetensors(path, tensors, config_metadata(strategy.model().config(), step));
  barrier(strategy);
}

}  // namespace braid::trainer
