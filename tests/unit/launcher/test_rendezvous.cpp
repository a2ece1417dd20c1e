// lightning-run's node rendezvous over a real TCPStore on 127.0.0.1: two nodes with unequal worker
// counts (each on its own thread) get consistent layouts; failures and completion travel between
// them; a node that never comes is a timeout with exit code 1; a node whose heartbeat stops is
// lost; a node is named as its --local-addr announces it; a peer's address in a worker's error is
// named as that node, and a failure is traced through nodes that only lost their peers to where
// it began. Elastic rounds: a group forms from the nodes present, a late node waits and is seen
// by node 0, the next round takes it in, a lost node is left out, the counts of attempts and
// restarts follow, and a node still waiting when the job ends leaves with exit code 0.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <future>
#include <thread>

#include "lightning/launcher/args.h"
#include "lightning/launcher/rendezvous.h"

namespace launcher = lightning::launcher;
using Catch::Matchers::Contains;

namespace {
launcher::LaunchArgs node_args(int node_rank, int num_nodes, int port, double timeout_s = 20, double node_timeout_s = 30) {
  launcher::LaunchArgs args;
  args.node_timeout_s = node_timeout_s;
  args.node_rank = node_rank;
  args.num_nodes = num_nodes;
  args.main_port = port;
  args.rdzv_timeout_s = timeout_s;
  return args;
}

// An IPv4 address of this machine other than loopback ("" when it has none).
std::string some_own_address() {
  std::string found;
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return found;
  for (const ifaddrs* entry = all; entry != nullptr && found.empty(); entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr, text, sizeof(text));
    if (std::string(text).rfind("127.", 0) != 0) found = text;
  }
  freeifaddrs(all);
  return found;
}

std::string own_host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
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
  other.announce_failure(0, {1, 3, 7, "exit code 7", false, {}});
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

TEST_CASE("rendezvous: node 0 names a node whose heartbeat stopped, and not one that finished", "[rendezvous]") {
  const int port = free_port();
  auto node1 = std::async(std::launch::async, [port] { return launcher::Rendezvous::establish(node_args(1, 2, port, 20, 3), 1); });
  auto node0 = launcher::Rendezvous::establish(node_args(0, 2, port, 20, 3), 1);
  auto other = node1.get();
  // Both beat for 5 s, longer than the 3 s timeout: nobody is lost.
  for (int i = 0; i < 50; ++i) {
    CHECK(other.watch_nodes(0).empty());
    CHECK(node0.watch_nodes(0).empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Node 1 goes silent: lost within the timeout plus a heartbeat.
  std::vector<launcher::LostNode> lost;
  const auto silent_since = std::chrono::steady_clock::now();
  while (lost.empty() && std::chrono::steady_clock::now() - silent_since < std::chrono::seconds(10)) {
    lost = node0.watch_nodes(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(lost.size() == 1);
  CHECK(lost[0].node_rank == 1);
  CHECK(lost[0].host == own_host_name());
  CHECK(lost[0].silent_s >= 3);
  // In the next attempt node 1 finishes and then stays silent: finished is not lost.
  other.announce_done(1);
  for (int i = 0; i < 45; ++i) {
    CHECK(node0.watch_nodes(1).empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

TEST_CASE("rendezvous: a failure is traced through the nodes that only lost their peers to where it began", "[rendezvous]") {
  const int port = free_port();
  std::vector<std::future<launcher::Rendezvous>> joining;
  for (int node = 1; node < 4; ++node) {
    joining.push_back(std::async(std::launch::async, [port, node] { return launcher::Rendezvous::establish(node_args(node, 4, port), 1); }));
  }
  auto node0 = launcher::Rendezvous::establish(node_args(0, 4, port), 1);
  std::vector<launcher::Rendezvous> others;
  for (auto& node : joining) others.push_back(node.get());
  const auto limit = std::chrono::milliseconds(500);

  // Attempt 0: node 2 died (no record); node 1's worker named node 2; node 0's names node 1.
  others[0].publish_suspects(0, {2});
  auto trace = node0.trace_suspects(0, {1}, limit);
  CHECK(trace.lost == std::vector<int>{2});
  CHECK(trace.failed.empty());
  CHECK(trace.followed);
  // Node 1's own trace: node 2 never answers, so the wait ends at the limit.
  const auto start = std::chrono::steady_clock::now();
  trace = others[0].trace_suspects(0, {2}, limit);
  CHECK(std::chrono::steady_clock::now() - start >= limit);
  CHECK(trace.lost == std::vector<int>{2});
  CHECK_FALSE(trace.followed);

  // Attempt 1: node 3's worker failed on its own; node 1 lost node 3; node 0 names nodes 1 and 3.
  others[2].publish_suspects(1, {});
  others[0].publish_suspects(1, {3});
  trace = node0.trace_suspects(1, {1, 3}, limit);
  CHECK(trace.lost.empty());
  CHECK(trace.failed == std::vector<int>{3});
  CHECK(trace.followed);
  CHECK(node0.describe_node(3) == "node 3 (" + own_host_name() + ")");

  // Attempt 2: nodes 0 and 1 lost each other (their link): each stays named.
  others[0].publish_suspects(2, {0});
  trace = node0.trace_suspects(2, {1}, limit);
  CHECK(trace.lost == std::vector<int>{1});
  CHECK_FALSE(trace.followed);
}

TEST_CASE("rendezvous: an address every node has (here: both nodes on this machine) names no node", "[rendezvous]") {
  // Naming a node by a unique address is covered across real hosts (hosts.fault_kill-host).
  const std::string address = some_own_address();
  if (address.empty()) {
    WARN("this machine has no address but loopback: nothing to name");
    return;
  }
  const int port = free_port();
  auto node1 = std::async(std::launch::async, [port] { return launcher::Rendezvous::establish(node_args(1, 2, port), 1); });
  auto node0 = launcher::Rendezvous::establish(node_args(0, 2, port), 1);
  auto other = node1.get();
  CHECK(node0.nodes_named_in("gloo::IoException: Read error [" + address + "]:41234: Connection reset by peer").empty());
  CHECK(other.nodes_named_in("Read error [" + address + "]:1").empty());
  CHECK(node0.nodes_named_in("nothing about peers").empty());
}

TEST_CASE("rendezvous: --local-addr is the name and an address a node announces", "[rendezvous]") {
  const int port = free_port();
  auto node1 = std::async(std::launch::async, [port] {
    auto args = node_args(1, 2, port);
    args.local_addr = "10.99.0.7";
    return launcher::Rendezvous::establish(args, 1);
  });
  auto node0 = launcher::Rendezvous::establish(node_args(0, 2, port), 1);
  auto other = node1.get();
  CHECK(node0.describe_node(0) == "node 0 (" + own_host_name() + ")");
  CHECK(node0.describe_node(1) == "node 1 (10.99.0.7)");
  CHECK(other.describe_node(1) == "node 1 (10.99.0.7)");
  CHECK(node0.node_names() == std::vector<std::string>{own_host_name(), "10.99.0.7"});
  // A worker's error naming that address names node 1.
  const auto named = node0.nodes_named_in("gloo::IoException: Read error [10.99.0.7]:41234: Connection reset by peer");
  REQUIRE(named.size() == 1);
  CHECK(named.front().node_rank == 1);
  CHECK(named.front().description == "10.99.0.7 (node 1, 10.99.0.7)");
}

namespace {
launcher::LaunchArgs elastic_args(int min, int max, int port, double last_call_s = 0.5) {
  launcher::LaunchArgs args = node_args(0, max, port, 20, 3);
  args.elastic = launcher::LaunchArgs::NodeRange{min, max};
  args.rdzv_last_call_s = last_call_s;
  return args;
}

// A node of an elastic job on 127.0.0.1, established and through its first round, on a thread.
std::future<launcher::Rendezvous> elastic_node(launcher::LaunchArgs args, int workers) {
  return std::async(std::launch::async, [args, workers] {
    auto node = launcher::Rendezvous::establish(args, workers);
    node.form_group(std::nullopt, [](const std::string&) {}, [] {});
    return node;
  });
}
}  // namespace

TEST_CASE("rendezvous: elastic rounds form groups of MIN..MAX, take in a late node and leave out a lost one", "[rendezvous]") {
  const int port = free_port();
  const auto args = elastic_args(2, 3, port);
  // On one machine every node names --main-address: the first to bind hosts, the others join.
  auto first = elastic_node(args, 2);
  auto second = elastic_node(args, 1);
  auto a = first.get(), b = second.get();
  launcher::Rendezvous& host = a.layout().node_rank == 0 ? a : b;
  launcher::Rendezvous& other = a.layout().node_rank == 0 ? b : a;
  CHECK(host.elastic());
  CHECK(other.layout().node_rank == 1);
  CHECK(host.layout().num_nodes == 2);
  CHECK(host.layout().world_size == 3);
  CHECK(other.layout().world_size == 3);
  CHECK(other.layout().rank_offset == host.layout().local_world_size);
  CHECK(host.layout().attempt == 0);
  CHECK(other.layout().restart_count == 0);
  CHECK(host.nodes_waiting().empty());

  // A late node arrives: it is not in the group, node 0 sees it waiting.
  std::vector<std::string> notes;
  auto late = std::async(std::launch::async, [&] {
    auto node = launcher::Rendezvous::establish(args, 4);
    node.form_group(std::nullopt, [&](const std::string& note) { notes.push_back(note); }, [] {});
    return node;
  });
  std::vector<std::string> waiting;
  for (int tries = 0; tries < 100 && waiting.empty(); ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    waiting = host.nodes_waiting();
  }
  REQUIRE(waiting.size() == 1);
  CHECK(waiting[0] == own_host_name());

  // The regroup: attempt 1, no restart counted, three nodes, the newcomer last (same host name).
  auto regrouped = std::async(std::launch::async, [&] { other.form_group(launcher::AttemptEnd{false, {}}, [](const std::string&) {}, [] {}); });
  host.form_group(launcher::AttemptEnd{false, {}}, [](const std::string&) {}, [] {});
  regrouped.get();
  auto third = late.get();
  CHECK_THAT(notes.at(0), Contains("waits to join at the next round"));
  for (auto* node : {&host, &other, &third}) {
    CHECK(node->layout().attempt == 1);
    CHECK(node->layout().restart_count == 0);
    CHECK(node->layout().num_nodes == 3);
    CHECK(node->layout().world_size == 7);
  }
  CHECK(third.layout().rank_offset + third.layout().local_world_size == 7);
  CHECK(host.nodes_waiting().empty());  // full: MAX nodes

  // The third node goes silent; after a failure the other two form a group without it, within
  // its heartbeat silence (--node-timeout 3 s here), and the restart counts.
  const auto started = std::chrono::steady_clock::now();
  auto again = std::async(std::launch::async, [&] { other.form_group(launcher::AttemptEnd{true, {}}, [](const std::string&) {}, [] {}); });
  host.form_group(launcher::AttemptEnd{true, {}}, [](const std::string&) {}, [] {});
  again.get();
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(10));
  for (auto* node : {&host, &other}) {
    CHECK(node->layout().attempt == 2);
    CHECK(node->layout().restart_count == 1);
    CHECK(node->layout().num_nodes == 2);
    CHECK(node->layout().world_size == 3);
  }

  // A node waiting for a place when node 0 ends the job leaves with exit code 0.
  auto waiter = std::async(std::launch::async, [&]() -> int {
    auto node = launcher::Rendezvous::establish(args, 1);
    try {
      node.form_group(std::nullopt, [](const std::string&) {}, [] {});
    } catch (const launcher::RendezvousError& error) {
      return error.exit_code();
    }
    return -1;
  });
  for (int tries = 0; tries < 100 && host.nodes_waiting().empty(); ++tries) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  host.close_rounds();
  CHECK(waiter.get() == 0);
}

TEST_CASE("rendezvous: an elastic round short of MIN times out naming the count", "[rendezvous]") {
  auto args = elastic_args(2, 3, free_port());
  args.rdzv_timeout_s = 1;
  auto node = launcher::Rendezvous::establish(args, 1);
  try {
    node.form_group(std::nullopt, [](const std::string&) {}, [] {});
    FAIL("a round with one node of MIN 2 formed");
  } catch (const launcher::RendezvousError& error) {
    CHECK(error.exit_code() == 1);
    CHECK_THAT(error.what(), Contains("1 node(s) joined rendezvous round 0") && Contains("needs at least 2"));
  }
}

TEST_CASE("rendezvous: a fixed-size node cannot join an elastic job", "[rendezvous]") {
  const int port = free_port();
  auto host = std::async(std::launch::async, [&] {
    auto args = elastic_args(2, 3, port);
    args.rdzv_timeout_s = 3;
    auto node = launcher::Rendezvous::establish(args, 1);
    try {
      node.form_group(std::nullopt, [](const std::string&) {}, [] {});
    } catch (const launcher::RendezvousError&) {
    }
  });
  try {
    launcher::Rendezvous::establish(node_args(1, 2, port), 1);
    FAIL("a --num-nodes 2 node joined a --num-nodes 2:3 job");
  } catch (const launcher::RendezvousError& error) {
    CHECK(error.exit_code() == 2);
    CHECK_THAT(error.what(), Contains("--num-nodes=2 but node 0 with --num-nodes=2:3"));
  }
  host.get();
}
