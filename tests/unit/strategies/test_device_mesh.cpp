// DeviceMesh: the groups and coordinates of 2-D and 3-D meshes over 4 and 8 ranks (threads of
// this process on gloo), flattened groups and sub-meshes, and the errors for bad shapes and names.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>

#include "../thread_ranks.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/strategies/device_mesh.h"

namespace lf = lightning::fabric;

namespace {
// Sums each rank's global rank over its group: what the group's members add up to.
int summed_over(lf::Collective& group, int rank) {
  at::Tensor value = at::full({1}, static_cast<double>(rank));
  group.all_reduce_(value, lf::ReduceOp::Sum);
  return static_cast<int>(value.item<double>());
}

// The global ranks of rank's group along the dimensions `along` (indices) of a row-major grid of
// `shape`, in group order (the first of them outermost).
std::vector<int> expected_group(const std::vector<int>& shape, int rank, const std::vector<size_t>& along) {
  std::vector<int> coordinates(shape.size()), strides(shape.size(), 1);
  for (size_t d = shape.size() - 1; d > 0; --d) strides[d - 1] = strides[d] * shape[d];
  for (size_t d = 0; d < shape.size(); ++d) coordinates[d] = rank / strides[d] % shape[d];
  int count = 1;
  for (size_t d : along) count *= shape[d];
  std::vector<int> ranks;
  for (int position = 0; position < count; ++position) {
    std::vector<int> here = coordinates;
    int rest = position;
    for (auto d = along.rbegin(); d != along.rend(); ++d) {
      here[*d] = rest % shape[*d];
      rest /= shape[*d];
    }
    int global = 0;
    for (size_t d = 0; d < shape.size(); ++d) global += here[d] * strides[d];
    ranks.push_back(global);
  }
  return ranks;
}

// Checks one group of the mesh against the row-major order: its ranks, size, this rank's
// coordinate and position in the group, and a sum over it.
void check_group(const lf::DeviceMesh& mesh, const std::string& name, const std::vector<int>& shape, int rank,
                 const std::vector<size_t>& along, lf_test::RankChecks& checks, const std::string& who) {
  const std::vector<int> ranks = expected_group(shape, rank, along);
  const int position = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
  checks.expect(mesh.group_ranks(name) == ranks, who + name + ": group ranks");
  checks.expect(mesh.size(name) == static_cast<int>(ranks.size()) && mesh.coordinate(name) == position,
                who + name + ": size and coordinate");
  checks.expect(mesh.group(name).world_size() == static_cast<int>(ranks.size()) && mesh.group(name).rank() == position,
                who + name + ": the group's size and rank");
  int sum = 0;
  for (int r : ranks) sum += r;
  checks.expect(summed_over(mesh.group(name), rank) == sum, who + name + ": a sum over the group");
}

void check_mesh(lf::Collective& world, lf_test::RankChecks& checks, const std::vector<lf::MeshDimension>& dimensions) {
  const int rank = world.rank();
  lf::DeviceMesh mesh(world, dimensions);
  std::vector<int> shape;
  std::string who = "rank " + std::to_string(rank) + " of (";
  for (const auto& dimension : dimensions) {
    shape.push_back(dimension.size);
    who += dimension.name + " " + std::to_string(dimension.size) + " ";
  }
  who += "): ";
  checks.expect(mesh.shape() == shape, who + "shape");
  for (size_t d = 0; d < dimensions.size(); ++d) check_group(mesh, dimensions[d].name, shape, rank, {d}, checks, who);
  if (dimensions.size() == 3) {  // the strategies' flattened groups: the last two, and the first alone renamed
    mesh.flatten({dimensions[1].name, dimensions[2].name}, "stage");
    mesh.flatten({dimensions[1].name}, "data");
    mesh.flatten({}, "alone");
    check_group(mesh, "stage", shape, rank, {1, 2}, checks, who);
    check_group(mesh, "data", shape, rank, {1}, checks, who);
    checks.expect(&mesh.group("data") == &mesh.group(dimensions[1].name), who + "one dimension flattened is its group");
    checks.expect(mesh.group_ranks("alone") == std::vector<int>{rank} && mesh.size("alone") == 1, who + "none flattened");
    auto sub = mesh.submesh({dimensions[1].name, dimensions[2].name});
    checks.expect(sub->names() == std::vector<std::string>{dimensions[1].name, dimensions[2].name} &&
                      &sub->group("stage") == &mesh.group("stage") && &sub->group("data") == &mesh.group("data") &&
                      !sub->has(dimensions[0].name),
                  who + "a sub-mesh shares the groups along its dimensions");
  }
}
}  // namespace

TEST_CASE("device mesh: 4 ranks as (2, 2), (1, 4) and (4, 1), three meshes over one world", "[device_mesh]") {
  const auto failures = lf_test::on_thread_ranks(4, [](lf::Collective& world, lf_test::RankChecks& checks) {
    check_mesh(world, checks, {{"data", 2}, {"tensor", 2}});
    check_mesh(world, checks, {{"data", 1}, {"tensor", 4}});
    check_mesh(world, checks, {{"data", 4}, {"tensor", 1}});
  });
  CHECK(failures == std::vector<std::string>());
}

TEST_CASE("device mesh: 8 ranks as (pipe 2, replicate 2, tensor 2) and (replicate 2, shard 2, tensor 2)",
          "[device_mesh]") {
  const auto failures = lf_test::on_thread_ranks(8, [](lf::Collective& world, lf_test::RankChecks& checks) {
    check_mesh(world, checks, {{"pipe", 2}, {"replicate", 2}, {"tensor", 2}});
    check_mesh(world, checks, {{"replicate", 2}, {"shard", 2}, {"tensor", 2}});
  });
  CHECK(failures == std::vector<std::string>());
}

TEST_CASE("device mesh: a shape that does not make the world, or bad names, is a ValueError", "[device_mesh]") {
  const auto failures = lf_test::on_thread_ranks(2, [](lf::Collective& world, lf_test::RankChecks& checks) {
    const auto message = [&](const std::vector<lf::MeshDimension>& dimensions) -> std::string {
      try {
        lf::DeviceMesh mesh(world, dimensions);
      } catch (const lf::ValueError& error) {
        return error.what();
      }
      return "no error";
    };
    const std::string three_by_two = message({{"shard", 3}, {"tensor", 2}});
    checks.expect(three_by_two.find("the dimensions (shard 3, tensor 2) make 6 ranks, not the world size 2") !=
                      std::string::npos,
                  "(3, 2) on 2 ranks: " + three_by_two);
    checks.expect(message({{"shard", 0}, {"tensor", 2}}).find("positive sizes") != std::string::npos, "(0, 2)");
    checks.expect(message({}).find("make 0 ranks") != std::string::npos, "no dimension");
    checks.expect(message({{"dp", 1}, {"dp", 2}}).find("names \"dp\" twice") != std::string::npos, "names");
    lf::DeviceMesh named(world, {{"dp", 1}, {"tp", 2}});
    checks.expect(named.size("tp") == 2 && named.coordinate("dp") == 0, "named dimensions");
    const auto error_of = [](const std::function<void()>& call) -> std::string {
      try {
        call();
      } catch (const lf::ValueError& error) {
        return error.what();
      }
      return "no error";
    };
    const std::string unknown = error_of([&] { named.size("tensor"); });
    checks.expect(unknown.find("no dimension or flattened group \"tensor\". This mesh has \"dp\" (1), \"tp\" (2)") !=
                      std::string::npos,
                  unknown);
    const std::string taken = error_of([&] { named.flatten({"dp"}, "tp"); });
    checks.expect(taken.find("the name \"tp\" is in use already") != std::string::npos, taken);
  });
  CHECK(failures == std::vector<std::string>());
}
