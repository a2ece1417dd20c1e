// Collective: a real gloo process group of two ranks, each on its own thread of this process,
// over a TCPStore on 127.0.0.1; the rendezvous errors; gloo's interface setting.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <future>
#include <thread>

#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/plugins/collectives/collective_rendezvous.h"
#include "../../thread_ranks.h"

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

namespace {
lf::CollectiveOptions options_for(int rank, int world_size, int port) {
  return lf_test::thread_rank_options(rank, world_size, port);
}

// Runs body(collective) on rank 0 and rank 1 at once; rank 0 hosts the store. A barrier ends each
// rank's body: a rank that destroyed its groups while the other's gloo listener had not yet taken
// its connections would make that one fail with "Connection closed by peer".
template <class Body>
void on_two_ranks(Body body, lf::ProcessGroupBackend backend = lf::ProcessGroupBackend::Gloo) {
  int port = 0;
  auto store = lf::host_store("127.0.0.1", 0, std::chrono::seconds(20), &port);
  auto rank1 = std::async(std::launch::async, [&] {
    auto options = options_for(1, 2, port);
    options.backend = backend;
    lf::Collective group(options);
    body(group);
    group.barrier();
  });
  auto options = options_for(0, 2, port);
  options.backend = backend;
  lf::Collective group(options, store);
  body(group);
  group.barrier();
  rank1.get();
}
}  // namespace

TEST_CASE("collective: two gloo ranks reduce, gather, broadcast and scatter", "[collective]") {
  on_two_ranks([](lf::Collective& group) {
    const int rank = group.rank();
    CHECK(group.world_size() == 2);
    CHECK(group.backend() == lf::ProcessGroupBackend::Gloo);
    CHECK(group.device() == at::Device(at::kCPU));
    at::Tensor sum = at::full({3}, rank + 1.0);
    group.all_reduce_(sum, lf::ReduceOp::Sum);
    CHECK(at::equal(sum, at::full({3}, 3.0)));
    at::Tensor mean = at::full({2}, rank * 4.0);
    group.all_reduce_(mean, lf::ReduceOp::Mean);
    CHECK(at::equal(mean, at::full({2}, 2.0)));
    const at::Tensor gathered = group.all_gather(at::full({2, 2}, static_cast<double>(rank)));
    CHECK(gathered.sizes() == at::IntArrayRef{2, 2, 2});
    CHECK(gathered[1].sum().item<double>() == 4.0);
    at::Tensor sent = rank == 1 ? at::arange(4.0) : at::zeros({4});
    group.broadcast_(sent, 1);
    CHECK(at::equal(sent, at::arange(4.0)));
    CHECK(group.broadcast_bytes(rank == 0 ? "from rank 0" : "", 0) == "from rank 0");
    const at::Tensor rows = at::arange(4.0).view({2, 2}) + rank;  // rank r keeps row r summed over ranks
    const at::Tensor mine = group.reduce_scatter(rows, lf::ReduceOp::Sum);
    CHECK(at::equal(mine, rank == 0 ? at::tensor({1.0, 3.0}) : at::tensor({5.0, 7.0})));
    CHECK(group.operation_count() > 0);
  });
}

TEST_CASE("the host vote: hosts in the order of their lowest rank, positions in rank order", "[collective]") {
  const auto pairs = lf::internal::host_layouts({"a", "b", "a", "b"});
  REQUIRE(pairs.size() == 4);
  CHECK(pairs[2].host == 0);
  CHECK(pairs[2].local_index == 1);
  CHECK(pairs[1].host == 1);
  CHECK(pairs[1].local_index == 0);
  CHECK(pairs[3].local_index == 1);
  CHECK(pairs[0].hosts == 2);
  CHECK(pairs[0].ranks_per_host == 2);
  CHECK(pairs[0].equal);
  CHECK_FALSE(pairs[0].one_host());
  const auto unequal = lf::internal::host_layouts({"x", "y", "y", "y"});
  CHECK_FALSE(unequal[0].equal);
  CHECK(unequal[0].ranks_per_host == 1);
  CHECK(unequal[3].ranks_per_host == 3);
  CHECK(unequal[3].local_index == 2);
  CHECK(unequal[0].counts == "x: 1 rank, y: 3 ranks");
  const auto one = lf::internal::host_layouts({"solo", "solo", "solo"});
  CHECK(one[2].one_host());
  CHECK(one[2].local_index == 2);
}

TEST_CASE("collective: shm+gloo sums through shm and gloo, and leaves the rest to gloo", "[collective]") {
  on_two_ranks(
      [](lf::Collective& group) {
        const int rank = group.rank();
        CHECK(group.backend() == lf::ProcessGroupBackend::ShmGloo);
        // 5 elements over 2 ranks: padded to 6 for the shm reduce-scatter.
        at::Tensor sum = at::arange(5.0) + rank;
        group.all_reduce_(sum, lf::ReduceOp::Sum);
        CHECK(at::equal(sum, at::arange(5.0) * 2 + 1));
        at::Tensor mean = at::full({3}, rank * 4.0, at::kFloat);
        group.all_reduce_(mean, lf::ReduceOp::Mean);
        CHECK(at::equal(mean, at::full({3}, 2.0, at::kFloat)));
        at::Tensor counts = at::full({7}, rank + 1, at::kLong);
        group.all_reduce_(counts, lf::ReduceOp::Sum);
        CHECK(at::equal(counts, at::full({7}, 3, at::kLong)));
        at::Tensor largest = at::full({2}, static_cast<double>(rank));  // max: on the gloo group
        group.all_reduce_(largest, lf::ReduceOp::Max);
        CHECK(at::equal(largest, at::ones({2}, at::kDouble)));
        at::Tensor started = at::ones({4});  // DDP's path: started, then waited for
        auto wait = group.all_reduce_start_(started);
        wait();
        CHECK(at::equal(started, at::full({4}, 2.0)));
        CHECK(group.all_gather(at::full({1}, static_cast<double>(rank))).sum().item<double>() == 1.0);
        CHECK(group.broadcast_bytes(rank == 1 ? "from rank 1" : "", 1) == "from rank 1");
        group.barrier();
        lf::Collective sub(group, "sub", {0, 1});
        sub.barrier();  // both ranks' connections taken before either destroys the group
        CHECK(sub.backend() == lf::ProcessGroupBackend::Shm);  // its own host vote: both ranks here
        CHECK_THROWS_WITH(lf::Collective(group, "named", {0, 1}, lf::ProcessGroupBackend::ShmGloo),
                          Contains("backend \"shm+gloo\" is not valid for a subgroup"));
      },
      lf::ProcessGroupBackend::ShmGloo);
}

TEST_CASE("collective: a subgroup of the world has its own ranks", "[collective]") {
  on_two_ranks([](lf::Collective& world) {
    lf::Collective just_one(world, "solo-" + std::to_string(world.rank()), {world.rank()});
    CHECK(just_one.world_size() == 1);
    CHECK(just_one.rank() == 0);
    lf::Collective reversed(world, "reversed", {1, 0});
    CHECK(reversed.rank() == 1 - world.rank());
    at::Tensor value = at::ones({1});
    reversed.all_reduce_(value, lf::ReduceOp::Sum);
    CHECK(value.item<double>() == 2.0);
    CHECK_THROWS_WITH(lf::Collective(world, "not-mine", {1 - world.rank()}), Contains("is not one of its ranks"));
  });
}

TEST_CASE("collective rendezvous: a rank that never arrives is named after the rendezvous timeout", "[collective]") {
  int port = 0;
  auto store = lf::host_store("127.0.0.1", 0, std::chrono::seconds(5), &port);
  auto options = options_for(0, 3, port);
  options.settings.rendezvous_timeout = std::chrono::milliseconds(300);
  CHECK_THROWS_WITH(lf::Collective(options, store),
                    Contains("Ranks 1, 2 of 3 did not join the process group within the rendezvous timeout (0.3 s)") &&
                        Contains("LT_RENDEZVOUS_TIMEOUT"));
}

TEST_CASE("collective rendezvous: without rank 0's store a rank says so after the timeout", "[collective]") {
  int port = 0;
  { lf::host_store("127.0.0.1", 0, std::chrono::seconds(5), &port); }  // a port nobody listens on now
  auto options = options_for(1, 2, port);
  options.settings.rendezvous_timeout = std::chrono::milliseconds(300);
  CHECK_THROWS_WITH(lf::Collective(options),
                    Contains("Rank 1 could not reach the store of rank 0 at 127.0.0.1:" + std::to_string(port)) &&
                        Contains("rank 0 did not start or failed before joining"));
}

TEST_CASE("collective rendezvous: rank 0 on a port already in use says so and names the fix", "[collective]") {
  int port = 0;
  auto taken = lf::host_store("127.0.0.1", 0, std::chrono::seconds(5), &port);  // another job's store
  auto options = options_for(0, 2, port);
  options.settings.rendezvous_timeout = std::chrono::milliseconds(300);
  CHECK_THROWS_WITH(lf::Collective(options),
                    Contains("Rank 0 could not host the store on port " + std::to_string(port)) &&
                        Contains("in use") && Contains("MASTER_PORT") && Contains("SLURM_STEP_ID"));
}

TEST_CASE("collective: gloo's interface must exist, and the error lists the host's", "[collective]") {
  int port = 0;
  auto store = lf::host_store("127.0.0.1", 0, std::chrono::seconds(5), &port);
  auto options = options_for(0, 1, port);
  options.settings.socket_interface = "no-such-if0";
  CHECK_THROWS_WITH(lf::Collective(options, store),
                    Contains("GLOO_SOCKET_IFNAME (process_group.socket_interface)=\"no-such-if0\" names no network "
                             "interface of this host") &&
                        Contains("lo"));
  options.settings.socket_interface = "lo";
  lf::Collective on_loopback(options, store);
  at::Tensor one = at::ones({1});
  on_loopback.all_reduce_(one, lf::ReduceOp::Sum);
  CHECK(one.item<double>() == 1.0);
}

TEST_CASE("collective: nccl needs a CUDA device", "[collective]") {
  auto options = options_for(0, 1, 1);
  options.backend = lf::ProcessGroupBackend::Nccl;
  CHECK_THROWS_WITH(lf::Collective(options), Contains("the nccl backend needs a CUDA device") && Contains("gloo or shm"));
}
