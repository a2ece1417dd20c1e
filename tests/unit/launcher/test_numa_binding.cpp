// --numa-binding's arithmetic against described machines (torch.numa.binding's four modes), the
// CPU-only spread of local ranks over NUMA nodes, the sysfs reader on a made-up sysfs, CPU lists.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/utilities/process.h"
#include "lightning/launcher/numa_binding.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

using Catch::Matchers::Contains;
namespace lf = lightning::fabric;
namespace launcher = lightning::launcher;
using launcher::NumaBinding;

namespace {
std::vector<int> cpus(std::initializer_list<std::pair<int, int>> ranges) {
  std::vector<int> ids;
  for (const auto& [from, to] : ranges) {
    for (int id = from; id <= to; ++id) ids.push_back(id);
  }
  return ids;
}

// 2 sockets of 8 cores, 2 hardware threads each (CPUs c and c + 16 are core c's threads), each
// socket with 2 L3 complexes of 4 cores. One NUMA node per socket (node = socket), or with
// nodes_per_socket = 2 one node per complex (sub-NUMA clustering: nodes 0-1 on socket 0, 2-3 on
// socket 1). 4 GPUs: 0 and 1 on node 0, 2 and 3 on node 1.
launcher::CpuTopology two_sockets(int nodes_per_socket = 1) {
  launcher::CpuTopology topology;
  for (int id = 0; id < 32; ++id) {
    const int core = id % 16;
    launcher::CpuInfo cpu;
    cpu.id = id;
    cpu.socket = core / 8;
    cpu.node = nodes_per_socket == 1 ? core / 8 : core / 4;
    cpu.core = core;
    cpu.cache = core / 4 * 4;
    topology.cpus.push_back(cpu);
  }
  topology.device_nodes = {0, 0, 1, 1};
  return topology;
}

std::vector<std::vector<int>> cpus_of(const std::vector<launcher::CpuBinding>& bindings) {
  std::vector<std::vector<int>> all;
  for (const auto& binding : bindings) all.push_back(binding.cpus);
  return all;
}

const std::vector<int> kNode0 = cpus({{0, 7}, {16, 23}}), kNode1 = cpus({{8, 15}, {24, 31}});
const std::vector<int> kComplex0 = cpus({{0, 3}, {16, 19}}), kComplex4 = cpus({{4, 7}, {20, 23}}),
                       kComplex8 = cpus({{8, 11}, {24, 27}}), kComplex12 = cpus({{12, 15}, {28, 31}});

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}
}  // namespace

TEST_CASE("numa binding: 2 sockets x 4 GPUs, every mode as torch.numa.binding defines it", "[numa]") {
  const auto topology = two_sockets();
  const std::vector<int> ranks{0, 1, 2, 3};  // local rank r uses GPU r
  // node: every CPU of the GPU's node (both threads of each core).
  const auto node = launcher::plan_numa_binding(topology, NumaBinding::Node, ranks);
  CHECK(cpus_of(node) == std::vector<std::vector<int>>{kNode0, kNode0, kNode1, kNode1});
  CHECK(node[0].node == 0);
  CHECK(node[3].node == 1);
  // socket: with one node per socket, the same as node.
  CHECK(cpus_of(launcher::plan_numa_binding(topology, NumaBinding::Socket, ranks)) == cpus_of(node));
  // exclusive: node 0's 8 cores split between GPUs 0 and 1, 4 cores (8 CPUs) each.
  CHECK(cpus_of(launcher::plan_numa_binding(topology, NumaBinding::Exclusive, ranks)) ==
        std::vector<std::vector<int>>{kComplex0, kComplex4, kComplex8, kComplex12});
  // core-complex: one L3 complex of the node each, in order.
  const auto complexes = launcher::plan_numa_binding(topology, NumaBinding::CoreComplex, ranks);
  CHECK(cpus_of(complexes) == std::vector<std::vector<int>>{kComplex0, kComplex4, kComplex8, kComplex12});
  CHECK(complexes[2].node == 1);
  // --devices 1,3: local rank 0 on GPU 1, local rank 1 on GPU 3 (their node's second share).
  CHECK(cpus_of(launcher::plan_numa_binding(topology, NumaBinding::Exclusive, {1, 3})) ==
        std::vector<std::vector<int>>{kComplex4, kComplex12});
}

TEST_CASE("numa binding: socket spans the nodes of the socket (sub-NUMA clustering)", "[numa]") {
  auto topology = two_sockets(2);
  topology.device_nodes = {0, 1, 2, 3};  // one GPU per node
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::Node, 0) == kComplex0);
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::Socket, 0) == kNode0);
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::Socket, 1) == kNode0);
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::Socket, 3) == kNode1);
  // Alone on its node: exclusive and core-complex give the whole node.
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::Exclusive, 2) == kComplex8);
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::CoreComplex, 3) == kComplex12);
}

TEST_CASE("numa binding: uneven splits, shared complexes, and CPUs this process may not use", "[numa]") {
  auto topology = two_sockets();
  topology.device_nodes = {0, 0, 0, 1};  // three GPUs on node 0
  // 8 cores for 3 GPUs: 3, 3 and 2 cores, the lowest GPUs taking the remainder.
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::Exclusive, 0) == std::vector<int>{0, 1, 2, 16, 17, 18});
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::Exclusive, 1) == std::vector<int>{3, 4, 5, 19, 20, 21});
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::Exclusive, 2) == std::vector<int>{6, 7, 22, 23});
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::Exclusive, 3) == kNode1);
  // 2 complexes for 3 GPUs: the third wraps around and shares GPU 0's.
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::CoreComplex, 0) == kComplex0);
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::CoreComplex, 1) == kComplex4);
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::CoreComplex, 2) == kComplex0);

  // lightning-run may not use core 0 (CPUs 0 and 16; taskset): they count nowhere.
  auto restricted = two_sockets();
  restricted.cpus.erase(std::remove_if(restricted.cpus.begin(), restricted.cpus.end(),
                                       [](const launcher::CpuInfo& cpu) { return cpu.id == 0 || cpu.id == 16; }),
                        restricted.cpus.end());
  CHECK(launcher::numa_cpus_for_device(restricted, NumaBinding::Node, 0) == cpus({{1, 7}, {17, 23}}));
  // 7 cores for 2 GPUs: 4 and 3.
  CHECK(launcher::numa_cpus_for_device(restricted, NumaBinding::Exclusive, 0) == std::vector<int>{1, 2, 3, 4, 17, 18, 19, 20});
  CHECK(launcher::numa_cpus_for_device(restricted, NumaBinding::Exclusive, 1) == std::vector<int>{5, 6, 7, 21, 22, 23});
  // The complex with more usable CPUs comes first: GPU 0 gets the whole second complex.
  CHECK(launcher::numa_cpus_for_device(restricted, NumaBinding::CoreComplex, 0) == kComplex4);
  CHECK(launcher::numa_cpus_for_device(restricted, NumaBinding::CoreComplex, 1) == std::vector<int>{1, 2, 3, 17, 18, 19});
}

TEST_CASE("numa binding: what cannot be bound is a clear error naming the flag", "[numa]") {
  auto topology = two_sockets();
  topology.device_nodes.assign(9, 0);  // 9 GPUs on node 0's 8 cores
  CHECK(launcher::numa_cpus_for_device(topology, NumaBinding::Node, 8) == kNode0);
  CHECK_THROWS_WITH(launcher::numa_cpus_for_device(topology, NumaBinding::Exclusive, 0),
                    Contains("--numa-binding=exclusive") && Contains("8 physical core(s)") && Contains("9 devices") &&
                        Contains("--numa-binding node or socket"));
  topology.device_nodes = {5};  // a node without CPUs (memory only), or none this process may use
  CHECK_THROWS_WITH(launcher::numa_cpus_for_device(topology, NumaBinding::Node, 0),
                    Contains("--numa-binding=node") && Contains("NUMA node 5") && Contains("0-31"));
  CHECK_THROWS_WITH(launcher::numa_cpus_for_device(topology, NumaBinding::Node, 1), Contains("device 1"));
  CHECK(launcher::parse_numa_binding("core-complex") == NumaBinding::CoreComplex);
  CHECK(launcher::numa_binding_choices() == std::vector<std::string>{"node", "socket", "exclusive", "core-complex"});
  CHECK_THROWS_WITH(launcher::parse_numa_binding("l3"),
                    Contains("--numa-binding=l3") && Contains("node, socket, exclusive, core-complex"));
}

TEST_CASE("numa binding: without GPUs, local ranks spread evenly over the NUMA nodes", "[numa]") {
  auto topology = two_sockets();  // nodes 0 and 1
  CHECK(launcher::cpu_device_nodes(topology, 4) == std::vector<int>{0, 0, 1, 1});
  CHECK(launcher::cpu_device_nodes(topology, 3) == std::vector<int>{0, 0, 1});
  CHECK(launcher::cpu_device_nodes(topology, 1) == std::vector<int>{0});
  topology.device_nodes = launcher::cpu_device_nodes(topology, 4);
  CHECK(cpus_of(launcher::plan_numa_binding(topology, NumaBinding::Exclusive, {0, 1, 2, 3})) ==
        std::vector<std::vector<int>>{kComplex0, kComplex4, kComplex8, kComplex12});

  // A machine of one node with 2 cores (as the CI machine): 2 workers share the node, or split it.
  launcher::CpuTopology small;
  small.cpus = {{0, 0, 0, 0, 0}, {1, 0, 0, 1, 0}};
  small.device_nodes = launcher::cpu_device_nodes(small, 2);
  CHECK(small.device_nodes == std::vector<int>{0, 0});
  CHECK(cpus_of(launcher::plan_numa_binding(small, NumaBinding::Node, {0, 1})) ==
        std::vector<std::vector<int>>{{0, 1}, {0, 1}});
  CHECK(cpus_of(launcher::plan_numa_binding(small, NumaBinding::Exclusive, {0, 1})) ==
        std::vector<std::vector<int>>{{0}, {1}});
  // One complex for two ranks: they share it.
  CHECK(cpus_of(launcher::plan_numa_binding(small, NumaBinding::CoreComplex, {0, 1})) ==
        std::vector<std::vector<int>>{{0, 1}, {0, 1}});
  CHECK(launcher::describe_numa_binding(launcher::plan_numa_binding(small, NumaBinding::Exclusive, {0, 1})) ==
        "local rank 0: CPUs 0 (NUMA node 0); local rank 1: CPUs 1 (NUMA node 0)");
}

TEST_CASE("numa binding: the topology as sysfs describes it", "[numa]") {
  const std::filesystem::path root = lf::make_temporary_directory("lf-numa-sysfs-");
  const auto system = root / "devices" / "system";
  write_file(system / "node" / "possible", "0-1\n");
  write_file(system / "node" / "node0" / "cpulist", "0-1\n");
  write_file(system / "node" / "node1" / "cpulist", "2-3\n");
  for (int id = 0; id < 4; ++id) {
    const auto cpu = system / "cpu" / ("cpu" + std::to_string(id));
    write_file(cpu / "topology" / "physical_package_id", id < 2 ? "0\n" : "1\n");
    write_file(cpu / "topology" / "thread_siblings_list", id < 2 ? "0-1\n" : std::to_string(id) + "\n");  // 0-1: one core
    if (id == 3) continue;  // no cache information
    write_file(cpu / "cache" / "index0" / "level", "1\n");
    write_file(cpu / "cache" / "index0" / "type", "Data\n");
    write_file(cpu / "cache" / "index0" / "shared_cpu_list", std::to_string(id) + "\n");
    write_file(cpu / "cache" / "index3" / "level", "3\n");
    write_file(cpu / "cache" / "index3" / "type", "Unified\n");
    write_file(cpu / "cache" / "index3" / "shared_cpu_list", id < 2 ? "0-1\n" : "2-3\n");
    write_file(cpu / "cache" / "index4" / "level", "4\n");  // not a data cache: left out
    write_file(cpu / "cache" / "index4" / "type", "Instruction\n");
    write_file(cpu / "cache" / "index4" / "shared_cpu_list", std::to_string(id) + "\n");
  }
  write_file(root / "bus" / "pci" / "devices" / "0000:3b:00.0" / "numa_node", "1\n");
  write_file(root / "bus" / "pci" / "devices" / "0000:5e:00.0" / "numa_node", "-1\n");

  const auto topology = launcher::read_cpu_topology(root.string(), {3, 0, 1});  // CPU 2 not allowed
  REQUIRE(topology.cpus.size() == 3);
  const auto& cpu0 = topology.cpus[0];
  const auto& cpu1 = topology.cpus[1];
  const auto& cpu3 = topology.cpus[2];
  CHECK((cpu0.id == 0 && cpu0.node == 0 && cpu0.socket == 0 && cpu0.core == 0 && cpu0.cache == 0));
  CHECK((cpu1.id == 1 && cpu1.node == 0 && cpu1.socket == 0 && cpu1.core == 0 && cpu1.cache == 0));
  CHECK((cpu3.id == 3 && cpu3.node == 1 && cpu3.socket == 1 && cpu3.core == 3 && cpu3.cache == 3));
  CHECK(launcher::pci_numa_node(root.string(), "0000:3b:00.0") == 1);
  CHECK(launcher::pci_numa_node(root.string(), "0000:5e:00.0") == 0);  // -1: one node
  CHECK(launcher::pci_numa_node(root.string(), "0000:99:00.0") == 0);  // no such device

  // Node 0's two CPUs are one core's threads: two devices cannot have a core each.
  auto two_on_node0 = topology;
  two_on_node0.device_nodes = {0, 0};
  CHECK(launcher::numa_cpus_for_device(two_on_node0, NumaBinding::Node, 1) == std::vector<int>{0, 1});
  CHECK_THROWS_WITH(launcher::numa_cpus_for_device(two_on_node0, NumaBinding::Exclusive, 0),
                    Contains("1 physical core(s)") && Contains("CPUs 0-1"));

  // A machine without NUMA in sysfs: one node, 0; each CPU its own core; the node one complex.
  const std::filesystem::path bare = lf::make_temporary_directory("lf-numa-bare-");
  const auto flat = launcher::read_cpu_topology(bare.string(), {0, 1});
  REQUIRE(flat.cpus.size() == 2);
  CHECK((flat.cpus[1].node == 0 && flat.cpus[1].socket == 0 && flat.cpus[1].core == 1 && flat.cpus[1].cache == 0));
  std::filesystem::remove_all(root);
  std::filesystem::remove_all(bare);
}

TEST_CASE("numa binding: CPU lists as sysfs writes them", "[numa]") {
  CHECK(launcher::parse_cpu_list("0-3,8,10-11\n") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(launcher::parse_cpu_list("\n").empty());
  CHECK(launcher::parse_cpu_list("5") == std::vector<int>{5});
  CHECK_THROWS_WITH(launcher::parse_cpu_list("3-1"), Contains("'3-1' is not a CPU list"));
  CHECK_THROWS_AS(launcher::parse_cpu_list("a,b"), lf::ValueError);
  CHECK(lf::cpu_list_text({11, 10, 8, 3, 2, 1, 0, 8}) == "0-3,8,10-11");
  CHECK(lf::cpu_list_text({}).empty());
  CHECK(launcher::parse_cpu_list(lf::cpu_list_text(kNode1)) == kNode1);
}
