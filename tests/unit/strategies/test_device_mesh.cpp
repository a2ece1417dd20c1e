// DeviceMesh: the groups and coordinates of 4 and 8 ranks (threads of this process on gloo), two
// meshes over one world, and the errors for bad shapes and names.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include "../thread_ranks.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/strategies/device_mesh.h"

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

namespace {
// Sums each rank's global rank over its group along dim: what the group's members add up to.
int summed_over(lf::Collective& group, int rank) {
  at::Tensor value = at::full({1}, static_cast<double>(rank));
  group.all_reduce_(value, lf::ReduceOp::Sum);
  return static_cast<int>(value.item<double>());
}

// Checks one rank of a data x tensor mesh against the documented order.
void check_mesh(lf::Collective& world, lf_test::RankChecks& checks, int data, int tensor) {
  const int rank = world.rank();
  lf::DeviceMesh mesh(world, data, tensor);
  const std::string who = "rank " + std::to_string(rank) + " of (" + std::to_string(data) + ", " +
                          std::to_string(tensor) + "): ";
  checks.expect(mesh.data_rank() == rank / tensor && mesh.tensor_rank() == rank % tensor, who + "coordinates");
  checks.expect(mesh.coordinate("tensor") == mesh.tensor_rank() && mesh.size("data") == data, who + "by name");
  std::vector<int> tensor_ranks, data_ranks;
  for (int t = 0; t < tensor; ++t) tensor_ranks.push_back(rank / tensor * tensor + t);
  for (int d = 0; d < data; ++d) data_ranks.push_back(d * tensor + rank % tensor);
  checks.expect(mesh.group_ranks("tensor") == tensor_ranks, who + "tensor group ranks");
  checks.expect(mesh.group_ranks("data") == data_ranks, who + "data group ranks");
  checks.expect(mesh.tensor_group().world_size() == tensor && mesh.tensor_group().rank() == rank % tensor,
                who + "tensor group size and rank");
  checks.expect(mesh.data_group().world_size() == data && mesh.data_group().rank() == rank / tensor,
                who + "data group size and rank");
  int tensor_sum = 0, data_sum = 0;
  for (int r : tensor_ranks) tensor_sum += r;
  for (int r : data_ranks) data_sum += r;
  checks.expect(summed_over(mesh.tensor_group(), rank) == tensor_sum, who + "a sum over the tensor group");
  checks.expect(summed_over(mesh.data_group(), rank) == data_sum, who + "a sum over the data group");
}
}  // namespace

TEST_CASE("device mesh: 4 ranks as (2, 2) and then (1, 4), two meshes over one world", "[device_mesh]") {
  const auto failures = lf_test::on_thread_ranks(4, [](lf::Collective& world, lf_test::RankChecks& checks) {
    check_mesh(world, checks, 2, 2);
    check_mesh(world, checks, 1, 4);
    check_mesh(world, checks, 4, 1);
  });
  CHECK(failures == std::vector<std::string>());
}

TEST_CASE("device mesh: 8 ranks as (2, 4) and (4, 2)", "[device_mesh]") {
  const auto failures = lf_test::on_thread_ranks(8, [](lf::Collective& world, lf_test::RankChecks& checks) {
    check_mesh(world, checks, 2, 4);
    check_mesh(world, checks, 4, 2);
  });
  CHECK(failures == std::vector<std::string>());
}

TEST_CASE("device mesh: a shape that does not make the world, or bad names, is a ValueError", "[device_mesh]") {
  const auto failures = lf_test::on_thread_ranks(2, [](lf::Collective& world, lf_test::RankChecks& checks) {
    const auto message = [&](int data, int tensor, std::array<std::string, 2> names) -> std::string {
      try {
        lf::DeviceMesh mesh(world, data, tensor, names);
      } catch (const lf::ValueError& error) {
        return error.what();
      }
      return "no error";
    };
    const std::string three_by_two = message(3, 2, {"data", "tensor"});
    checks.expect(three_by_two.find("data_parallel_size=3 x tensor_parallel_size=2 does not make the world size 2") !=
                      std::string::npos,
                  "(3, 2) on 2 ranks: " + three_by_two);
    checks.expect(message(0, 2, {"data", "tensor"}).find("positive sizes") != std::string::npos, "(0, 2)");
    checks.expect(message(1, 2, {"dp", "dp"}).find("two different non-empty names") != std::string::npos, "names");
    lf::DeviceMesh named(world, 1, 2, {"dp", "tp"});
    checks.expect(named.size("tp") == 2 && named.coordinate("dp") == 0, "named dimensions");
    try {
      named.size("tensor");
      checks.expect(false, "an unknown dimension name was accepted");
    } catch (const lf::ValueError& error) {
      checks.expect(std::string(error.what()).find("no dimension \"tensor\". Its dimensions: \"dp\" (1) and \"tp\" (2)") !=
                        std::string::npos,
                    error.what());
    }
  });
  CHECK(failures == std::vector<std::string>());
}
