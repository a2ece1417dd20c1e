// lightning-run's node rendezvous over a real TCPStore on 127.0.0.1: two nodes with unequal worker
// counts (each on its own thread) get consistent layouts; failures and completion travel between
// them; a node that never comes is a timeout with exit code 1.
#include <catch2/catch.hpp>

#include <future>

#include "lightning/launcher/args.h"
#include "lightning/launcher/rendezvous.h"

namespace launcher = lightning::launcher;
using Catch::Matchers::Contains;

namespace {
launcher::LaunchArgs node_args(int node_rank, int num_nodes, int port, double timeout_s = 20) {
  launcher::LaunchArgs args;
  args.node_rank = node_rank;
  args.num_nodes = num_nodes;
  args.main_port = port;
  args.rdzv_timeout_s = timeout_s;
  return args;
}

int free_port() {
  auto probe = launcher::Rendezvous::establish(node_args(0, 1, 0), 1);  // a one-node store on a free port
  return probe.port();
}
}  // namespace

TEST_CASE("rendezvous: two nodes with 3 and 1 workers agree on offsets, world size and run id", "[rendezvous]") {
  const int port = free_port();
  auto node1 = std::async(std::launch::async, [port] { return launcher::Rendezvous::establish(node_args(1, 2, port), 1); });
  auto node0 = launcher::Rendezvous::establish(node_args(0, 2, port), 3);
  auto other = node1.get();
  CHECK(node0.layout().rank_offset == 0);
  CHECK(other.layout().rank_offset == 3);
  CHECK(node0.layout().world_size == 4);
  CHECK(other.layout().world_size == 4);
  CHECK(other.layout().local_world_size == 1);
  CHECK(node0.layout().run_id == other.layout().run_id);
  CHECK_FALSE(node0.layout().run_id.empty());

  CHECK_FALSE(node0.failure(0).has_value());
  other.announce_failure(0, {1, 3, 7, "exit code 7"});
  const auto seen = node0.failure(0);
  REQUIRE(seen.has_value());
  CHECK(seen->global_rank == 3);
  CHECK(seen->exit_code == 7);
  CHECK(seen->summary == "exit code 7");

  node0.announce_done(1);
  CHECK_FALSE(node0.all_done(1));
  other.announce_done(1);
  CHECK(node0.all_done(1));
}

TEST_CASE("rendezvous: a node that never arrives ends the wait with exit code 1", "[rendezvous]") {
  const int port = free_port();
  try {
    launcher::Rendezvous::establish(node_args(0, 2, port, 0.5), 1);
    FAIL("the rendezvous succeeded without node 1");
  } catch (const launcher::RendezvousError& error) {
    CHECK(error.exit_code() == 1);
    CHECK_THAT(error.what(), Contains("timed out after 0.5") && Contains("1"));
  }
}
