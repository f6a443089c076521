// The device mesh: the rank map (TP innermost, then DP, then PP), the
// layout each rank's model gets, and, on forked ranks, that the split
// communicators hold exactly the ranks of their groups in axis order.
#include <catch2/catch.hpp>

#include "runtime/errors.h"
#include "tests/comm/harness.h"
#include "trainer/strategy/process_groups.h"

namespace braid::trainer {
namespace {

using braid::test::expect;

TEST_CASE("mesh: ranks map to (dp, tp, pp) with tp innermost, then dp, then pp", "[mesh]") {
  const MeshShape s{2, 2, 2};
  CHECK(mesh_coord(s, 0) == MeshCoord{0, 0, 0});
  CHECK(mesh_coord(s, 1) == MeshCoord{0, 1, 0});
  CHECK(mesh_coord(s, 2) == MeshCoord{1, 0, 0});
  CHECK(mesh_coord(s, 5) == MeshCoord{0, 1, 1});
  CHECK(mesh_coord(s, 7) == MeshCoord{1, 1, 1});
  CHECK(group_ranks(s, 5, MeshAxis::kTp) == std::vector<int>{4, 5});
  CHECK(group_ranks(s, 5, MeshAxis::kDp) == std::vector<int>{5, 7});
  CHECK(group_ranks(s, 5, MeshAxis::kPp) == std::vector<int>{1, 5});
  for (const MeshShape& shape : {MeshShape{2, 2, 2}, MeshShape{3, 2, 1}, MeshShape{1, 4, 2}, MeshShape{2, 1, 3}}) {
    for (int r = 0; r < shape.world_size(); ++r) CHECK(mesh_rank(shape, mesh_coord(shape, r)) == r);
  }
  const std::string map = describe_rank_map(s);
  CHECK_THAT(map, Catch::Contains("world 8 = dp 2 x tp 2 x pp 2"));
  CHECK_THAT(map, Catch::Contains("tp groups: [0 1] [2 3] [4 5] [6 7]"));
  CHECK_THAT(map, Catch::Contains("dp groups: [0 2] [1 3] [4 6] [5 7]"));
  CHECK_THAT(map, Catch::Contains("pp groups: [0 4] [1 5] [2 6] [3 7]"));
  CHECK_THROWS_AS(validate(MeshShape{2, 2, 1}, 8), InvalidUsage);
  CHECK_THROWS_AS(validate(MeshShape{0, 2, 4}, 0), InvalidUsage);
}

TEST_CASE("mesh: each stage gets a contiguous block range, extra blocks first", "[mesh]") {
  const GptConfig config{5, 4, 32, 16, 256};
  const MeshShape s{1, 2, 2};
  const ModelLayout first = mesh_model_layout(config, s, {0, 1, 0});
  const ModelLayout last = mesh_model_layout(config, s, {0, 0, 1});
  CHECK(first.tp_rank == 1);
  CHECK(first.tp_size == 2);
  CHECK((first.pp_first_layer == 0 && first.pp_last_layer == 3 && first.pp_is_first_stage && !first.pp_is_last_stage));
  CHECK((last.pp_first_layer == 3 && last.pp_last_layer == 5 && !last.pp_is_first_stage && last.pp_is_last_stage));
  CHECK_THROWS_AS(mesh_model_layout(config, MeshShape{1, 1, 6}, {0, 0, 0}), InvalidUsage);  // a stage of no block
  CHECK_THROWS_AS(mesh_model_layout(config, MeshShape{1, 8, 1}, {0, 0, 0}), InvalidUsage);  // 4 heads over 8
}

// Every group's members, as its communicator sees them, are the map's.
void expect_groups(comm::Communicator& world, const MeshShape& shape) {
  ProcessGroups g = ProcessGroups::build(world, shape);
  expect(g.coord == mesh_coord(shape, world.rank()), "coordinates differ from the map");
  const std::pair<comm::Communicator*, MeshAxis> axes[] = {
      {g.tp_group.get(), MeshAxis::kTp}, {g.dp_group.get(), MeshAxis::kDp}, {g.pp_group.get(), MeshAxis::kPp}};
  for (const auto& [group, axis] : axes) {
    const std::vector<int> expected = group_ranks(shape, world.rank(), axis);
    std::int64_t mine = world.rank();
    std::vector<std::int64_t> members(static_cast<std::size_t>(group->size()));
    group->all_gather(&mine, members.data(), 1, DataType::i64).wait();
    const std::vector<int> got(members.begin(), members.end());
    expect(got == expected, "rank " + std::to_string(world.rank()) + ": a group of dp " + std::to_string(shape.dp) +
                                " x tp " + std::to_string(shape.tp) + " x pp " + std::to_string(shape.pp) +
                                " has other members than the map says");
  }
}

braid::test::RunOptions run_options() {
  braid::test::RunOptions options;
  options.deadline = std::chrono::seconds(60);
  options.config = braid::test::test_config(std::chrono::seconds(20));
  return options;
}

TEST_CASE("mesh: split builds the tp, dp and pp groups of the map", "[mesh]") {
  SECTION("8 ranks: 2 x 2 x 2") {
    const auto result = braid::test::run_ranks(8, [](comm::Communicator& world) {
      expect_groups(world, MeshShape{2, 2, 2});
    }, run_options());
    INFO(result.summary());
    REQUIRE(result.all_ok());
  }
  SECTION("4 ranks: every shape") {
    const auto result = braid::test::run_ranks(4, [](comm::Communicator& world) {
      for (const MeshShape& shape : {MeshShape{2, 2, 1}, MeshShape{1, 2, 2}, MeshShape{2, 1, 2}, MeshShape{4, 1, 1},
                                     MeshShape{1, 4, 1}, MeshShape{1, 1, 4}}) {
        expect_groups(world, shape);
      }
    }, run_options());
    INFO(result.summary());
    REQUIRE(result.all_ok());
  }
}

}  // namespace
}  // namespace braid::trainer
