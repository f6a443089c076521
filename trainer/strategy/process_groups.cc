// The mesh arithmetic and the three splits of the world communicator.
//
// Each split's color names the group (the coordinates on the other two
// axes) and its key is the coordinate on the group's own axis, so the rank
// of a process inside its group is its coordinate on that axis. The splits
// run in one fixed order (tp, dp, pp) on every rank: split is collective
// over the world.
#include "trainer/strategy/process_groups.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "runtime/errors.h"

namespace braid::trainer {

namespace {

int axis_size(const MeshShape& s, MeshAxis axis) {
  return axis == MeshAxis::kDp ? s.dp : axis == MeshAxis::kTp ? s.tp : s.pp;
}

int& axis_coord(MeshCoord& c, MeshAxis axis) {
  return axis == MeshAxis::kDp ? c.dp : axis == MeshAxis::kTp ? c.tp : c.pp;
}

// The world rank of the group's first member: the group's name.
int group_color(const MeshShape& shape, int rank, MeshAxis axis) {
  MeshCoord c = mesh_coord(shape, rank);
  axis_coord(c, axis) = 0;
  return mesh_rank(shape, c);
}

std::unique_ptr<comm::Communicator> split_axis(comm::Communicator& world, const MeshShape& shape,
                                               MeshAxis axis) {
  MeshCoord c = mesh_coord(shape, world.rank());
  return world.split(group_color(shape, world.rank(), axis), axis_coord(c, axis));
}

std::string join(const std::vector<int>& ranks) {
  std::string text = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? " " : "") + std::to_string(ranks[i]);
  return text + "]";
}

// Every group along `axis`, each once: "tp groups: [0 1] [2 3]".
std::string describe_groups(const MeshShape& shape, MeshAxis axis, const char* name) {
  std::string line = std::string(name) + " groups:";
  for (int r = 0; r < shape.world_size(); ++r) {
    if (group_color(shape, r, axis) == r) line += " " + join(group_ranks(shape, r, axis));
  }
  return line;
}

}  // namespace

void validate(const MeshShape& s, int world_size) {
  if (s.dp < 1 || s.tp < 1 || s.pp < 1) {
    throw InvalidUsage("every mesh axis needs at least 1 rank (got dp " + std::to_string(s.dp) + ", tp " +
                       std::to_string(s.tp) + ", pp " + std::to_string(s.pp) + ")");
  }
  if (s.world_size() != world_size) {
    throw InvalidUsage("dp " + std::to_string(s.dp) + " x tp " + std::to_string(s.tp) + " x pp " +
                       std::to_string(s.pp) + " = " + std::to_string(s.world_size()) +
                       " ranks, but the world has " + std::to_string(world_size) +
                       "; choose axes whose product is the number of ranks");
  }
}

MeshCoord mesh_coord(const MeshShape& s, int rank) {
  return MeshCoord{(rank / s.tp) % s.dp, rank % s.tp, rank / (s.tp * s.dp)};
}

int mesh_rank(const MeshShape& s, const MeshCoord& c) { return c.pp * s.dp * s.tp + c.dp * s.tp + c.tp; }

std::vector<int> group_ranks(const MeshShape& shape, int rank, MeshAxis axis) {
  MeshCoord c = mesh_coord(shape, rank);
  std::vector<int> ranks;
  for (int i = 0; i < axis_size(shape, axis); ++i) {
    axis_coord(c, axis) = i;
    ranks.push_back(mesh_rank(shape, c));
  }
  return ranks;
}

std::string describe_rank_map(const MeshShape& s) {
  std::ostringstream out;
  out << "world " << s.world_size() << " = dp " << s.dp << " x tp " << s.tp << " x pp " << s.pp
      << " (tp innermost, then dp, then pp)\n";
  out << "rank  dp  tp  pp\n";
  for (int r = 0; r < s.world_size(); ++r) {
    const MeshCoord c = mesh_coord(s, r);
    out << std::setw(4) << r << std::setw(4) << c.dp << std::setw(4) << c.tp << std::setw(4) << c.pp << "\n";
  }
  out << describe_groups(s, MeshAxis::kTp, "tp") << "\n"
      << describe_groups(s, MeshAxis::kDp, "dp") << "\n"
      << describe_groups(s, MeshAxis::kPp, "pp") << "\n";
  return out.str();
}

ModelLayout mesh_model_layout(const GptConfig& config, const MeshShape& shape, const MeshCoord& coord) {
  const int P = shape.pp, L = config.n_layer;
  if (P > L) {
    throw InvalidUsage("pp " + std::to_string(P) + " stages need at least as many blocks (n_layer " +
                       std::to_string(L) + "); use fewer stages or more layers");
  }
  // Stage p starts after p stages of L / P blocks and min(p, L % P) extra ones.
  auto first_layer = [&](int p) { return p * (L / P) + std::min(p, L % P); };
  ModelLayout layout{coord.tp, shape.tp, first_layer(coord.pp), first_layer(coord.pp + 1),
                     coord.pp == 0, coord.pp == P - 1};
  validate(config, layout);
  return layout;
}

ProcessGroups ProcessGroups::build(comm::Communicator& world, const MeshShape& shape) {
  validate(shape, world.size());
  ProcessGroups groups;
  groups.shape = shape;
  groups.coord = mesh_coord(shape, world.rank());
  groups.tp_group = split_axis(world, shape, MeshAxis::kTp);
  groups.dp_group = split_axis(world, shape, MeshAxis::kDp);
  groups.pp_group = split_axis(world, shape, MeshAxis::kPp);
  return groups;
}

}  // namespace braid::trainer
