#include "trainer/train/state_io.h"

#include <cstdio>
#include <functional>
#include <string>

#include "runtime/errors.h"
#include "trainer/checkpoint/atomic_file.h"
#include "trainer/checkpoint/layout.h"
#include "trainer/model/param_table.h"
#include "trainer/train/write_together.h"

namespace braid::trainer {

namespace {

struct SlotKey {
  Slot slot;
  const char* prefix;  // of the tensor keys in checkpoints
};
constexpr SlotKey kParamsOnly[] = {{Slot::kParams, ""}};
constexpr SlotKey kAllSlots[] = {{Slot::kParams, ""}, {Slot::kM, "m."}, {Slot::kV, "v."}};

// Runs this rank's part of a collective write and returns once every
// rank's is on disk (write_together: a slow disk delays the save, a stuck
// one fails it on every rank); one process just writes.
void write_all(comm::Communicator* comm, const std::string& what, const std::function<void(WriteProgress*)>& write) {
  if (comm == nullptr) return write(nullptr);
  write_together(*comm, what, [&](WriteProgress& progress) { write(&progress); });
}

std::string shards_of(std::int64_t step) { return "the shards of step " + std::to_string(step); }

// Once every rank has written its shard: rank 0, which publishes the step,
// must see them all in its staging directory. Ranks that wrote elsewhere (a
// disk of their own node, a relative --checkpoint-dir from another working
// directory) would leave a published step that cannot be loaded. Every rank
// gets rank 0's count (a broadcast) and fails alike.
void check_shards_seen(comm::Communicator* comm, const std::filesystem::path& staging, int world_size,
                       std::int64_t step) {
  if (comm == nullptr) return;
  std::int64_t seen[2] = {0, -1};  // shards missing, the first rank missing
  if (comm->rank() == 0) {
    const std::vector<int> missing = missing_shards(staging, world_size);
    seen[0] = static_cast<std::int64_t>(missing.size());
    if (!missing.empty()) seen[1] = missing.front();
  }
  comm->broadcast(seen, seen, 2, DataType::i64, 0).wait();
  if (seen[0] == 0) return;
  throw InvalidUsage("the checkpoint of step " + std::to_string(step) + " is not published: rank 0 does not see " +
                     std::to_string(seen[0]) + " of the " + std::to_string(world_size) + " shards (rank " +
                     std::to_string(seen[1]) + "'s first) in " +
                     (comm->rank() == 0 ? staging.string() : "its staging directory") +
                     ": every rank must write to the same directory, on a file system they all share, and a "
                     "relative --checkpoint-dir needs the same working directory on every rank");
}

// A random name for one save, rank 0's, sent to every rank (a broadcast):
// its shards and its manifest carry it (write_shard).
std::string agree_save_id(comm::Communicator& comm) {
  std::string id = comm.rank() == 0 ? layout::new_save_id() : std::string(16, '0');
  comm.broadcast(id.data(), id.data(), id.size(), DataType::u8, 0).wait();
  return id;
}

// Every rank's shard of a step into its staging directory, which rank 0
// then sees whole. A save that failed (a full disk, a rank that wrote
// elsewhere) left the shards written so far in DIR/step_N.partial, holding
// on to the space a full disk lacked: rank 0 removes the staging directory
// before the error goes on (best effort: a rank's writer still stuck in
// the kernel may hold its file open a while).
void write_shards(comm::Communicator* comm, const std::filesystem::path& staging, int world_size, std::int64_t step,
                  const std::function<void(WriteProgress*)>& write) {
  try {
    write_all(comm, shards_of(step), write);
    check_shards_seen(comm, staging, world_size, step);
  } catch (...) {
    if (comm == nullptr || comm->rank() == 0) {
      std::error_code ignored;
      std::filesystem::remove_all(staging, ignored);
    }
    throw;
  }
}

// Rank 0 publishes the step (`commit`: its manifest, the rename, `latest`)
// while the other ranks wait for the outcome (write_all): a commit that
// failed (a full disk at the manifest, a rename refused) fails every rank,
// where the others went on training and then failed on a closed
// communicator, and leaves no staging directory holding the shards' space.
std::filesystem::path publish(comm::Communicator* comm, const std::filesystem::path& staging,
                              const std::filesystem::path& dir, std::int64_t step,
                              const std::function<std::filesystem::path(WriteProgress*)>& commit) {
  std::filesystem::path published = step_directory(dir, step);
  const bool commits = comm == nullptr || comm->rank() == 0;
  try {
    write_all(comm, "the checkpoint of step " + std::to_string(step), [&](WriteProgress* progress) {
      if (commits) published = commit(progress);
    });
  } catch (...) {
    if (commits) {
      std::error_code ignored;
      std::filesystem::remove_all(staging, ignored);
    }
    throw;
  }
  return published;
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
  // Whole tensors from the file; this rank's TP slice of each to the strategy.
  std::vector<float> whole, part;
  for (const SlotKey& s : slots) {
    for (const ParamView& v : model.table().views()) {
      std::size_t count = 1;
      for (std::int64_t d : v.full_shape) count *= static_cast<std::size_t>(d);
      whole.resize(count);
      part.resize(v.count());
      reader.read(s.prefix + v.name, v.full_shape, whole.data());
      copy_tp_part(v, model.layout(), whole.data(), part.data());
      strategy.write_view(s.slot, v, part.data());
    }
  }
}

// What this rank owns, tensor by tensor; pieces of a device's memory are
// copied to host vectors kept in `copies`.
std::vector<TensorPiece> owned_pieces(Strategy& strategy, std::vector<std::vector<float>>& copies) {
  std::vector<TensorPiece> pieces;
  const bool on_host = strategy.model().device() == Device::kCpu;
  for (const SlotKey& s : kAllSlots) {
    for (const Held& h : strategy.owned(s.slot)) {
      for (const ParamView& v : strategy.model().table().views()) {
        const Range r = intersect(h.range, v.range());
        if (r.count == 0) continue;  // padding belongs to no tensor
        const float* data = h.data + (r.offset - h.range.offset);
        if (!on_host) {
          std::vector<float>& copy = copies.emplace_back(r.count);
          strategy.ops().to_host(copy.data(), data, r.count * sizeof(float));
          data = copy.data();
        }
        pieces.push_back({s.prefix + v.name, r.offset - v.offset, r.count, data});
      }
    }
  }
  return pieces;
}

std::filesystem::path save_sharded_checkpoint(Strategy& strategy, const std::filesystem::path& checkpoint_dir,
                                              const TrainState& state, const StepFiles& extra) {
  // Each rank through its hold on the directory (braid-train's
  // SharedCheckpointDir), or by name where it holds none.
  return through_hold(checkpoint_dir, [&](const std::filesystem::path& dir) {
    const std::filesystem::path staging = prepare_step_directory(dir, state.step);
    std::vector<std::vector<float>> copies;
    const std::vector<TensorPiece> pieces = owned_pieces(strategy, copies);
    const std::string save = strategy.comm() != nullptr ? agree_save_id(*strategy.comm()) : std::string();
    // The manifest goes last, once every shard is durable.
    write_shards(strategy.comm(), staging, strategy.world_size(), state.step, [&](WriteProgress* progress) {
      write_shard(staging, strategy.rank(), strategy.world_size(), pieces, strategy.model().config(), state.step,
                  progress, save);
    });
    return publish(strategy.comm(), staging, dir, state.step, [&](WriteProgress* progress) {
      return commit_sharded_checkpoint(dir, state, strategy.world_size(), std::string(strategy_name(strategy.kind())),
                                       extra, 2, save, progress);
    });
  });
}

std::filesystem::path save_mesh_checkpoint(Mesh& mesh, comm::Communicator& world,
                                           const std::filesystem::path& checkpoint_dir, const TrainState& state,
                                           const StepFiles& extra) {
  return through_hold(checkpoint_dir, [&](const std::filesystem::path& dir) {
    const std::filesystem::path staging = prepare_step_directory(dir, state.step);
    const Gpt& model = mesh.strategy().model();
    const bool writer = mesh.groups().coord.dp == 0 && mesh.groups().coord.tp == 0;
    std::vector<std::vector<float>> values;
    std::vector<TensorPiece> pieces;
    values.reserve(std::size(kAllSlots) * model.table().views().size());
    for (const SlotKey& s : kAllSlots) {
      for (const ParamView& v : model.table().views()) {
        std::vector<float> whole = mesh.read_whole(s.slot, v);  // collective over DP and TP
        // The tied wte is written once, by the first stage.
        if (!writer || (v.name == "wte.weight" && !model.layout().pp_is_first_stage)) continue;
        values.push_back(std::move(whole));
        pieces.push_back({s.prefix + v.name, 0, values.back().size(), values.back().data()});
      }
    }
    const std::string save = agree_save_id(world);
    write_shards(&world, staging, world.size(), state.step, [&](WriteProgress* progress) {
      write_shard(staging, world.rank(), world.size(), pieces, model.config(), state.step, progress, save);
    });
    const MeshShape& shape = mesh.groups().shape;
    const std::string layout = std::string(strategy_name(mesh.strategy().kind())) + " on dp " +
                               std::to_string(shape.dp) + " x tp " + std::to_string(shape.tp) + " x pp " +
                               std::to_string(shape.pp);
    return publish(&world, staging, dir, state.step,
                   [&](WriteProgress* progress) {
                     return commit_sharded_checkpoint(dir, state, world.size(), layout, extra, 2, save, progress);
                   });
  });
}

void save_strategy_weights(Strategy& strategy, const std::filesystem::path& path, std::int64_t step) {
  const ParamTable& table = strategy.model().table();
  std::vector<std::vector<float>> values;
  std::vector<TensorToWrite> tensors;
  for (const ParamView& v : table.views()) {
    values.push_back(strategy.read_view(Slot::kParams, v));
    tensors.push_back({v.name, v.full_shape, values.back().data()});
  }
  write_all(strategy.comm(), path.string(), [&](WriteProgress* progress) {
    if (strategy.rank() == 0) write_safetensors(path, tensors, config_metadata(strategy.model().config(), step), progress);
  });
}

}  // namespace braid::trainer
