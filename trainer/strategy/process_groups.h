// The device mesh: how a world of D x T x P ranks is cut into data-,
// tensor- and pipeline-parallel groups (picotron's process_group_manager).
//
// TP ranks are adjacent (innermost: they exchange activations every layer,
// so they should share a host), then DP, then PP (outermost: a stage sends
// one activation per micro-batch to its neighbour):
//
//   rank = pp * (D * T) + dp * T + tp
//
// With D = T = P = 2: TP groups {0,1} {2,3} {4,5} {6,7}, DP groups {0,2}
// {1,3} {4,6} {5,7}, PP groups {0,4} {1,5} {2,6} {3,7}. A group's ranks are
// ordered by their coordinate on its axis, so a rank's index in its TP group
// is its tp_rank and in its PP group its stage.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "trainer/model/gpt_config.h"

namespace braid::trainer {

struct MeshShape {
  int dp = 1;
  int tp = 1;
  int pp = 1;

  int world_size() const { return dp * tp * pp; }
  bool operator==(const MeshShape&) const = default;
};

// A rank's place in the mesh.
struct MeshCoord {
  int dp = 0;
  int tp = 0;
  int pp = 0;

  bool operator==(const MeshCoord&) const = default;
};

enum class MeshAxis { kDp, kTp, kPp };

// Throws InvalidUsage when an axis is below 1 or D x T x P != world_size.
void validate(const MeshShape& shape, int world_size);

MeshCoord mesh_coord(const MeshShape& shape, int rank);
int mesh_rank(const MeshShape& shape, const MeshCoord& coord);

// The world ranks of `rank`'s group along `axis`, ordered by that axis.
std::vector<int> group_ranks(const MeshShape& shape, int rank, MeshAxis axis);

// "world 8 = dp 2 x tp 2 x pp 2 (tp innermost, then dp, then pp)", a table
// of rank -> (dp, tp, pp), and the members of every group, one line each.
std::string describe_rank_map(const MeshShape& shape);

// The part of the GPT that the rank at `coord` holds: its TP slice and its
// pipeline stage's blocks. Blocks are cut as evenly as possible, the first
// n_layer % P stages taking one more (the last stage also runs the head).
// Throws InvalidUsage when a stage would get no block or the heads do not
// divide by T.
ModelLayout mesh_model_layout(const GptConfig& config, const MeshShape& shape, const MeshCoord& coord);

// One rank's communicators along the three axes. Built collectively from
// the world communicator: every rank must call build() with the same shape.
// Axes of size 1 still get a (one-rank) communicator, so callers never test
// for null.
struct ProcessGroups {
  MeshShape shape;
  MeshCoord coord;
  std::unique_ptr<comm::Communicator> tp_group;
  std::unique_ptr<comm::Communicator> dp_group;
  std::unique_ptr<comm::Communicator> pp_group;

  static ProcessGroups build(comm::Communicator& world, const MeshShape& shape);
};

}  // namespace braid::trainer
