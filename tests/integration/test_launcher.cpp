// lightning-run end to end: real processes, 127.0.0.1, ports from the OS, short timeouts, and
// a check that nothing is left behind after each run.
#include <signal.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "harness.h"
#include "lightning/launcher/numa_binding.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

using Catch::Matchers::Contains;
using lf_test::Launched;

namespace {
std::vector<std::string> with_worker(std::vector<std::string> flags, std::vector<std::string> worker_args) {
  std::vector<std::string> args{"model"};
  args.insert(args.end(), flags.begin(), flags.end());
  args.push_back(lf_test::worker_path());
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return args;
}

void check_no_leftovers(const Launched& run) {
  // PDEATHSIG and the group kill act at once, but the kernel reaps asynchronously (slowly on a
  // loaded machine): allow up to 5 s.
  for (int i = 0; i < 250 && !lf_test::processes_with_marker(run.marker()).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(lf_test::processes_with_marker(run.marker()).empty());
}

std::map<int, std::map<std::string, std::string>> env_by_rank(const std::string& output) {
  std::map<int, std::map<std::string, std::string>> result;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("[rank ", 0) != 0) continue;
    const int rank = std::stoi(line.substr(6));
    const auto body = line.substr(line.find("]: ") + 3);
    const auto eq = body.find('=');
    if (eq != std::string::npos) result[rank][body.substr(0, eq)] = body.substr(eq + 1);
  }
  return result;
}

const std::vector<std::string> kFast{"--accelerator", "cpu", "--shutdown-grace", "2"};
std::vector<std::string> fast(std::vector<std::string> more) {
  std::vector<std::string> flags = kFast;
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}
}  // namespace

TEST_CASE("launcher: every worker gets the environment contract", "[launcher]") {
  Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2", "--precision", "bf16-mixed"}), {"env"}),
               {{"LF_TEST_INHERITED", "yes"}});
  REQUIRE(run.wait(60) == 0);
  const auto envs = env_by_rank(run.out());
  REQUIRE(envs.size() == 2);
  std::set<std::string> run_ids, error_files;
  for (const auto& [rank, vars] : envs) {
    INFO("rank " << rank);
    CHECK(vars.at("LT_CLI_USED") == "1");
    CHECK(vars.at("LT_ACCELERATOR") == "cpu");
    CHECK(vars.at("LT_PRECISION") == "bf16-mixed");
    CHECK(vars.count("LT_STRATEGY") == 0);  // only when the flag is given
    CHECK(vars.at("LT_DEVICES") == "2");
    CHECK(vars.at("LT_NUM_NODES") == "1");
    CHECK(vars.at("RANK") == std::to_string(rank));
    CHECK(vars.at("LOCAL_RANK") == std::to_string(rank));
    CHECK(vars.at("ROLE_RANK") == std::to_string(rank));
    CHECK(vars.at("WORLD_SIZE") == "2");
    CHECK(vars.at("LOCAL_WORLD_SIZE") == "2");
    CHECK(vars.at("ROLE_WORLD_SIZE") == "2");
    CHECK(vars.at("GROUP_RANK") == "0");
    CHECK(vars.at("NODE_RANK") == "0");
    CHECK(vars.at("GROUP_WORLD_SIZE") == "1");
    CHECK(vars.at("ROLE_NAME") == "default");
    CHECK(vars.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(std::stoi(vars.at("MASTER_PORT")) > 0);
    CHECK(vars.at("TORCHELASTIC_RESTART_COUNT") == "0");
    CHECK(vars.at("TORCHELASTIC_MAX_RESTARTS") == "0");
    CHECK(vars.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
    CHECK(vars.at("OMP_NUM_THREADS") == std::to_string(std::max(1u, std::thread::hardware_concurrency() / 2)));
    CHECK(vars.at("LF_TEST_INHERITED") == "yes");
    run_ids.insert(vars.at("TORCHELASTIC_RUN_ID"));
    error_files.insert(vars.at("TORCHELASTIC_ERROR_FILE"));
  }
  CHECK(run_ids.size() == 1);
  CHECK(error_files.size() == 2);
  CHECK_THAT(run.err(), Contains("OMP_NUM_THREADS="));
  check_no_leftovers(run);
}

TEST_CASE("launcher: an OMP_NUM_THREADS the user set is kept", "[launcher]") {
  Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "1"}), {"env"}), {{"OMP_NUM_THREADS", "7"}});
  REQUIRE(run.wait(60) == 0);
  CHECK_THAT(run.out(), Contains("OMP_NUM_THREADS=7"));
  CHECK_THAT(run.out(), !Contains("[rank 0]"));  // one worker: untagged by default
}

TEST_CASE("launcher: arguments after the binary reach it untouched", "[launcher]") {
  Launched run(lf_test::launcher_path(),
               with_worker(fast({"--devices", "1"}), {"args", "--devices", "8", "--", "two words", "--help"}));
  REQUIRE(run.wait(60) == 0);
  CHECK(run.out() == "arg=--devices\narg=8\narg=--\narg=two words\narg=--help\n");
}

TEST_CASE("launcher: 1, 2 and 8 workers pass a first barrier", "[launcher]") {
  for (int workers : {1, 2, 8}) {
    Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", std::to_string(workers)}), {"barrier"}));
    REQUIRE(run.wait(120) == 0);
    for (int rank = 0; rank < workers; ++rank) {
      CHECK_THAT(run.out(), Contains("rank " + std::to_string(rank) + " passed barrier"));
    }
    check_no_leftovers(run);
  }
}

TEST_CASE("launcher: two nodes on one machine with unequal worker counts", "[launcher][multinode]") {
  const std::string port = std::to_string(lf_test::free_port());
  const std::vector<std::string> common{"--num-nodes", "2", "--main-address", "127.0.0.1", "--main-port", port};
  auto node0_flags = fast(common);
  node0_flags.insert(node0_flags.end(), {"--node-rank", "0", "--devices", "2"});
  auto node1_flags = fast(common);
  node1_flags.insert(node1_flags.end(), {"--node-rank", "1", "--devices", "1"});
  Launched node0(lf_test::launcher_path(), with_worker(node0_flags, {"barrier"}));
  Launched node1(lf_test::launcher_path(), with_worker(node1_flags, {"barrier"}));
  REQUIRE(node1.wait(60) == 0);
  REQUIRE(node0.wait(60) == 0);
  CHECK_THAT(node0.out(), Contains("[rank 0]: rank 0 passed barrier") && Contains("[rank 1]: rank 1 passed barrier"));
  CHECK_THAT(node1.out(), Contains("[rank 2]: rank 2 passed barrier"));
  CHECK_THAT(node1.err(), Contains("ranks 2-2 of 3"));
  check_no_leftovers(node0);
  check_no_leftovers(node1);
}

TEST_CASE("launcher: a failure on one node stops the other node through the store", "[launcher][multinode][faults]") {
  const std::string port = std::to_string(lf_test::free_port());
  auto flags = [&](const std::string& rank) {
    return fast({"--num-nodes", "2", "--node-rank", rank, "--main-port", port, "--devices", "1"});
  };
  Launched node0(lf_test::launcher_path(), with_worker(flags("0"), {"exit-later", "1", "3"}));
  Launched node1(lf_test::launcher_path(), with_worker(flags("1"), {"exit-later", "1", "3"}));
  CHECK(node1.wait(60) == 3);
  CHECK(node0.wait(60) == 3);
  CHECK_THAT(node1.err(), Contains("rank 1 (node 1, local rank 0) failed first: exit code 3"));
  CHECK_THAT(node0.err(), Contains("rank 1 on node 1 failed first: exit code 3"));
  check_no_leftovers(node0);
  check_no_leftovers(node1);
}

TEST_CASE("launcher: fault matrix", "[launcher][faults]") {
  struct Fault {
    std::vector<std::string> worker_args;
    int expected_code;
    std::string report;
  };
  const std::vector<Fault> faults = {
      {{"exit", "1", "3"}, 3, "rank 1 (node 0, local rank 1) failed first: exit code 3"},
      {{"throw", "1"}, 128 + SIGABRT, "its error file says: std::runtime_error: boom from rank 1"},
      {{"segv", "0"}, 128 + SIGSEGV, "failed first: signal SIGSEGV (11)"},
      // rank 1 hangs before joining; rank 0's rendezvous times out after 5 s, throws, and aborts
      {{"hang", "1"}, 128 + SIGABRT, "rank 0 (node 0, local rank 0) failed first: signal SIGABRT (6)"},
  };
  for (const auto& fault : faults) {
    INFO(fault.worker_args.front());
    Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2"}), fault.worker_args));
    const auto code = run.wait(60);
    REQUIRE(code.has_value());
    CHECK(*code == fault.expected_code);
    CHECK_THAT(run.err(), Contains(fault.report));
    CHECK(run.seconds() < 30);
    check_no_leftovers(run);
  }
}

TEST_CASE("launcher: a worker killed by SIGKILL ends the job with 137", "[launcher][faults]") {
  Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2"}), {"wait-signal"}));
  REQUIRE(run.wait_for_output("ready 1", 30));
  REQUIRE(run.wait_for_output("ready 0", 30));
  int victim = -1;
  for (int pid : lf_test::processes_with_marker(run.marker())) {
    std::ifstream environ("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(environ)), std::istreambuf_iterator<char>());
    if (content.find(std::string("RANK=1") + '\0') != std::string::npos && pid != run.pid()) victim = pid;
  }
  REQUIRE(victim > 0);
  kill(victim, SIGKILL);
  CHECK(run.wait(30) == 128 + SIGKILL);
  CHECK_THAT(run.err(), Contains("rank 1") && Contains("SIGKILL"));
  check_no_leftovers(run);
}

TEST_CASE("launcher: a rank that hangs after the others finished is stopped by --finish-timeout", "[launcher][faults]") {
  Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2", "--finish-timeout", "1"}), {"hang-alone", "1"}));
  CHECK(run.wait(30) == 124);
  CHECK_THAT(run.err(), Contains("rank 1") && Contains("--finish-timeout"));
  CHECK(run.seconds() < 15);
  check_no_leftovers(run);
}

TEST_CASE("launcher: SIGINT and SIGTERM are forwarded and end the job with 128 + signal", "[launcher][signals]") {
  for (int sig : {SIGINT, SIGTERM}) {
    Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2"}), {"wait-signal"}));
    REQUIRE(run.wait_for_output("ready 0", 30));
    REQUIRE(run.wait_for_output("ready 1", 30));
    run.signal(sig);
    CHECK(run.wait(30) == 128 + sig);
    CHECK(run.seconds() < 30);
    check_no_leftovers(run);
  }
}

TEST_CASE("launcher: workers get a polite signal they can handle before any SIGKILL", "[launcher][signals]") {
  // A peer fails: the survivor sees SIGTERM and finishes its 200 ms handler within the grace period.
  Launched failed(lf_test::launcher_path(), with_worker(fast({"--devices", "2"}), {"save-on-signal", "1"}));
  CHECK(failed.wait(30) == 3);
  CHECK_THAT(failed.out(), Contains("rank 0 saved after signal " + std::to_string(SIGTERM)));
  check_no_leftovers(failed);
  // The launcher is interrupted or terminated: every worker gets that signal and saves.
  for (int sig : {SIGINT, SIGTERM}) {
    Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2"}), {"save-on-signal", "-1"}));
    REQUIRE(run.wait_for_output("ready 0", 30));
    REQUIRE(run.wait_for_output("ready 1", 30));
    run.signal(sig);
    CHECK(run.wait(30) == 128 + sig);
    for (int rank : {0, 1}) {
      CHECK_THAT(run.out(), Contains("rank " + std::to_string(rank) + " saved after signal " + std::to_string(sig)));
    }
    check_no_leftovers(run);
  }
}

TEST_CASE("launcher: SIGUSR1 is forwarded and the job goes on", "[launcher][signals]") {
  Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2"}), {"wait-signal"}));
  REQUIRE(run.wait_for_output("ready 0", 30));
  REQUIRE(run.wait_for_output("ready 1", 30));
  run.signal(SIGUSR1);
  CHECK(run.wait_for_output("got SIGUSR1 0", 10));
  CHECK(run.wait_for_output("got SIGUSR1 1", 10));
  // The launcher, its guardian (docs/launcher.md) and both workers live on.
  CHECK(lf_test::processes_with_marker(run.marker()).size() == 4);
  run.signal(SIGTERM);
  CHECK(run.wait(30) == 128 + SIGTERM);
  check_no_leftovers(run);
}

TEST_CASE("launcher: killing the launcher with SIGKILL takes its workers down", "[launcher][signals]") {
  Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2"}), {"wait-signal"}));
  REQUIRE(run.wait_for_output("ready 0", 30));
  REQUIRE(run.wait_for_output("ready 1", 30));
  run.signal(SIGKILL);
  CHECK(run.wait(10) == 128 + SIGKILL);
  check_no_leftovers(run);
}

TEST_CASE("launcher: --signals-to-handle chooses the signals that stop the job; the others take their default action",
          "[launcher][signals]") {
  // Listed: SIGHUP stops the job as before (forwarded, the teardown, 128 + 1).
  {
    Launched run(lf_test::launcher_path(),
                 with_worker(fast({"--devices", "2", "--signals-to-handle", "SIGTERM,SIGHUP"}), {"wait-signal"}));
    REQUIRE(run.wait_for_output("ready 0", 30));
    REQUIRE(run.wait_for_output("ready 1", 30));
    run.signal(SIGHUP);
    CHECK(run.wait(30) == 128 + SIGHUP);
    CHECK_THAT(run.err(), Contains("received SIGHUP") && Contains("exiting with " + std::to_string(128 + SIGHUP)));
    check_no_leftovers(run);
  }
  // Not listed: SIGHUP's default action ends lightning-run at once, and its guardian (and the
  // workers' death signal) take the workers down.
  {
    Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2", "--signals-to-handle", "SIGTERM"}), {"wait-signal"}));
    REQUIRE(run.wait_for_output("ready 0", 30));
    REQUIRE(run.wait_for_output("ready 1", 30));
    run.signal(SIGHUP);
    CHECK(run.wait(30) == 128 + SIGHUP);
    CHECK_THAT(run.err(), !Contains("received SIGHUP") && !Contains("exiting with"));
    check_no_leftovers(run);
  }
  // SIGUSR1 listed: it stops the job (torchrun's meaning) instead of being forwarded while the job goes on.
  {
    Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2", "--signals-to-handle", "SIGUSR1"}), {"wait-signal"}));
    REQUIRE(run.wait_for_output("ready 0", 30));
    REQUIRE(run.wait_for_output("ready 1", 30));
    run.signal(SIGUSR1);
    CHECK(run.wait(30) == 128 + SIGUSR1);
    CHECK_THAT(run.err(), Contains("received SIGUSR1"));
    check_no_leftovers(run);
  }
  Launched bad(lf_test::launcher_path(), with_worker(fast({"--signals-to-handle", "SIGTERM,SIGKILL"}), {"env"}));
  CHECK(bad.wait(30) == 2);
  CHECK_THAT(bad.err(), Contains("--signals-to-handle=SIGTERM,SIGKILL") && Contains("'SIGKILL'") && Contains("SIGUSR1"));
}

namespace {
// "affinity R: LIST" lines (test_worker's affinity mode): each rank's CPUs.
std::map<int, std::vector<int>> affinity_by_rank(const std::string& output) {
  std::map<int, std::vector<int>> result;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    const auto at = line.find("affinity ");
    if (at == std::string::npos) continue;
    const auto colon = line.find(": ", at);
    result[std::stoi(line.substr(at + 9))] = lightning::launcher::parse_cpu_list(line.substr(colon + 2));
  }
  return result;
}

std::vector<int> common_cpus(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> both;
  for (int cpu : a) {
    if (std::find(b.begin(), b.end(), cpu) != b.end()) both.push_back(cpu);
  }
  return both;
}

// This machine's NUMA nodes as sysfs lists them (node -> its CPUs that this process may use, the
// nodes without such CPUs left out); without NUMA in sysfs, one node 0 with every allowed CPU.
std::map<int, std::vector<int>> numa_nodes_here() {
  const std::vector<int> allowed = lightning::launcher::allowed_cpus();
  std::map<int, std::vector<int>> nodes;
  std::error_code error;
  for (std::filesystem::directory_iterator entry("/sys/devices/system/node", error), end; !error && entry != end;
       entry.increment(error)) {
    const std::string name = entry->path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 || name.find_first_not_of("0123456789", 4) != std::string::npos) continue;
    std::ifstream list(entry->path() / "cpulist");
    std::string text((std::istreambuf_iterator<char>(list)), std::istreambuf_iterator<char>());
    const auto cpus = common_cpus(lightning::launcher::parse_cpu_list(text), allowed);
    if (!cpus.empty()) nodes[std::stoi(name.substr(4))] = cpus;
  }
  if (nodes.empty()) nodes[0] = allowed;
  return nodes;
}

// The physical cores among cpus (the smallest CPU of each thread_siblings_list).
std::set<int> physical_cores(const std::vector<int>& cpus) {
  std::set<int> cores;
  for (int cpu : cpus) {
    std::ifstream list("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list");
    std::string text((std::istreambuf_iterator<char>(list)), std::istreambuf_iterator<char>());
    const auto siblings = lightning::launcher::parse_cpu_list(text);
    cores.insert(siblings.empty() ? cpu : *std::min_element(siblings.begin(), siblings.end()));
  }
  return cores;
}
}  // namespace

TEST_CASE("launcher: --numa-binding sets each worker's CPUs before it runs", "[launcher][numa]") {
  // Without GPUs, 2 local ranks of N nodes take node r * N / 2: both node 0 on a machine of one node.
  const auto nodes = numa_nodes_here();
  std::vector<std::vector<int>> expected_node;
  for (int rank = 0; rank < 2; ++rank) expected_node.push_back(std::next(nodes.begin(), rank * static_cast<int>(nodes.size()) / 2)->second);

  Launched node(lf_test::launcher_path(), with_worker(fast({"--devices", "2", "--numa-binding", "node"}), {"affinity"}));
  REQUIRE(node.wait(60) == 0);
  auto bound = affinity_by_rank(node.out());
  REQUIRE(bound.size() == 2);
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << "\n" << node.all());
    CHECK(bound[rank] == expected_node[static_cast<size_t>(rank)]);  // every CPU of its node it may use
  }
  CHECK_THAT(node.err(), Contains("--numa-binding node: local rank 0: CPUs"));
  check_no_leftovers(node);

  // exclusive: the node's cores split between the ranks on it, without overlap.
  Launched exclusive(lf_test::launcher_path(), with_worker(fast({"--devices", "2", "--numa-binding", "exclusive"}), {"affinity"}));
  const bool shared = expected_node[0] == expected_node[1];
  if (shared && physical_cores(expected_node[0]).size() < 2) {
    // One core for two ranks: refused before anything starts.
    CHECK(exclusive.wait(60) == 2);
    CHECK_THAT(exclusive.err(), Contains("--numa-binding=exclusive") && Contains("physical core(s)"));
    return;
  }
  REQUIRE(exclusive.wait(60) == 0);
  bound = affinity_by_rank(exclusive.out());
  REQUIRE(bound.size() == 2);
  INFO(exclusive.all());
  CHECK_FALSE(bound[0].empty());
  CHECK_FALSE(bound[1].empty());
  CHECK(common_cpus(bound[0], bound[1]).empty());
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(common_cpus(bound[rank], expected_node[static_cast<size_t>(rank)]) == bound[rank]);  // within its node
  }
  check_no_leftovers(exclusive);
}

TEST_CASE("launcher: --virtual-local-rank gives every worker LOCAL_RANK=0", "[launcher]") {
  Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2", "--virtual-local-rank"}), {"env"}));
  REQUIRE(run.wait(60) == 0);
  const auto envs = env_by_rank(run.out());
  REQUIRE(envs.size() == 2);
  for (const auto& [rank, vars] : envs) {
    INFO("rank " << rank);
    CHECK(vars.at("RANK") == std::to_string(rank));
    CHECK(vars.at("LOCAL_RANK") == "0");
    CHECK(vars.at("LOCAL_WORLD_SIZE") == "2");
    CHECK(vars.at("LT_VIRTUAL_LOCAL_RANK") == "1");
  }
}

TEST_CASE("launcher: --main-port in use is a clear error", "[launcher][rendezvous]") {
  const int blocker = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  REQUIRE(bind(blocker, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(listen(blocker, 1) == 0);
  socklen_t length = sizeof(address);
  getsockname(blocker, reinterpret_cast<sockaddr*>(&address), &length);
  const std::string port = std::to_string(ntohs(address.sin_port));
  Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "1", "--main-port", port}), {"env"}));
  CHECK(run.wait(30) == 2);
  CHECK_THAT(run.err(), Contains("--main-port " + port + " is already in use"));
  close(blocker);
}

TEST_CASE("launcher: an unreachable main address fails within --rdzv-timeout", "[launcher][rendezvous]") {
  const std::string port = std::to_string(lf_test::free_port());  // nobody listens there
  Launched run(lf_test::launcher_path(),
               with_worker(fast({"--num-nodes", "2", "--node-rank", "1", "--main-port", port, "--rdzv-timeout", "2"}), {"env"}));
  CHECK(run.wait(30) == 1);
  CHECK_THAT(run.err(), Contains("could not reach the rendezvous at 127.0.0.1:" + port));
  CHECK(run.seconds() < 15);
}

TEST_CASE("launcher: a duplicate node rank and a disagreeing --num-nodes are named", "[launcher][rendezvous]") {
  const std::string port = std::to_string(lf_test::free_port());
  auto node = [&](const std::string& nodes, const std::string& rank) {
    return with_worker(fast({"--num-nodes", nodes, "--node-rank", rank, "--main-port", port, "--rdzv-timeout", "20"}), {"env"});
  };
  Launched node0(lf_test::launcher_path(), node("3", "0"));
  Launched a(lf_test::launcher_path(), node("3", "1"));
  Launched b(lf_test::launcher_path(), node("3", "1"));
  const std::string message = "already joined this rendezvous as --node-rank=1";
  // Whichever of the two registers second is refused; the other keeps waiting for node 2.
  bool refused = false;
  for (int i = 0; i < 300 && !refused; ++i) refused = a.wait_for_output(message, 0.05) || b.wait_for_output(message, 0.05);
  REQUIRE(refused);
  Launched& loser = a.all().find(message) != std::string::npos ? a : b;
  Launched& winner = &loser == &a ? b : a;
  CHECK(loser.wait(30) == 2);
  Launched wrong(lf_test::launcher_path(), node("4", "2"));
  CHECK(wrong.wait(30) == 2);
  CHECK_THAT(wrong.err(), Contains("--num-nodes=4") && Contains("--num-nodes=3"));
  node0.signal(SIGTERM);
  winner.signal(SIGTERM);
  CHECK(node0.wait(30).has_value());
  CHECK(winner.wait(30).has_value());
  check_no_leftovers(node0);
  check_no_leftovers(winner);
}

TEST_CASE("launcher: --max-restarts reruns the whole job with TORCHELASTIC_RESTART_COUNT", "[launcher][restarts]") {
  Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2", "--max-restarts", "2"}), {"fail-first", "1"}));
  CHECK(run.wait(60) == 0);
  CHECK_THAT(run.err(), Contains("rank 1 (node 0, local rank 1) failed first: exit code 3"));
  CHECK_THAT(run.err(), Contains("restarting the job: attempt 2 of 3"));
  CHECK_THAT(run.out(), Contains("rank 0 finished attempt 1") && Contains("rank 1 finished attempt 1"));
  check_no_leftovers(run);

  Launched exhausted(lf_test::launcher_path(), with_worker(fast({"--devices", "2", "--max-restarts", "1"}), {"exit", "0", "5"}));
  CHECK(exhausted.wait(60) == 5);
  CHECK_THAT(exhausted.err(), Contains("no restarts left (--max-restarts=1)"));
}

TEST_CASE("launcher: output is tagged, filtered, timestamped and logged per rank", "[launcher][output]") {
  const auto log_dir = std::filesystem::temp_directory_path() / ("lf-logs-" + std::to_string(getpid()));
  Launched run(lf_test::launcher_path(),
               with_worker(fast({"--devices", "2", "--local-ranks-filter", "1", "--timestamp-output", "--log-dir",
                                 log_dir.string()}),
                           {"print", "3"}));
  REQUIRE(run.wait(60) == 0);
  CHECK_THAT(run.out(), Contains("[rank 1]: line 2 of rank 1"));
  CHECK_THAT(run.out(), !Contains("of rank 0"));
  CHECK_THAT(run.err(), Contains("[rank 1]: stderr of rank 1"));
  CHECK_THAT(run.out(), Contains("T"));  // ISO timestamps
  std::ifstream rank0(log_dir / "attempt_0" / "rank_0.stdout");
  std::string first;
  std::getline(rank0, first);
  CHECK(first == "line 0 of rank 0");  // files hold the raw lines of every rank
  std::filesystem::remove_all(log_dir);
  Launched untagged(lf_test::launcher_path(), with_worker(fast({"--devices", "2", "--no-tag-output"}), {"print", "1"}));
  REQUIRE(untagged.wait(60) == 0);
  CHECK_THAT(untagged.out(), Contains("line 0 of rank 1\n") && !Contains("[rank"));
}

TEST_CASE("launcher: --dry-run prints each worker and starts nothing", "[launcher]") {
  Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "2", "--dry-run"}), {"args", "x y"}));
  REQUIRE(run.wait(30) == 0);
  CHECK_THAT(run.out(), Contains("[rank 0] env") && Contains("[rank 1] env") && Contains("RANK=1") &&
                            Contains("LT_CLI_USED=1") && Contains("'x y'"));
  CHECK_THAT(run.out(), Contains("nothing is started"));
  // What will really happen: the port is picked at start, so no made-up number is shown.
  CHECK_THAT(run.out(), Contains("MASTER_PORT='<free port chosen at start>'") && !Contains("MASTER_PORT=29400") &&
                            Contains("LT_FLIGHT_DIR='<run dir>/attempt_0'"));
  Launched fixed(lf_test::launcher_path(), with_worker(fast({"--devices", "1", "--main-port", "29555", "--dry-run"}), {"args"}));
  REQUIRE(fixed.wait(30) == 0);
  CHECK_THAT(fixed.out(), Contains("MASTER_PORT=29555"));
}

TEST_CASE("launcher: a single-node store listens on loopback only", "[launcher][rendezvous]") {
  Launched run(lf_test::launcher_path(), with_worker(fast({"--devices", "1"}), {"wait-signal"}));
  REQUIRE(run.wait_for_output("ready 0", 30));
  const auto err = run.err();
  const auto at = err.find("rendezvous at 127.0.0.1:");
  REQUIRE(at != std::string::npos);
  const int port = std::stoi(err.substr(at + std::string("rendezvous at 127.0.0.1:").size()));
  // /proc/net/tcp{,6}: the listening socket's local address must be loopback.
  bool found = false, loopback = true;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      if (state != "0A") continue;  // LISTEN
      const auto colon = local.rfind(':');
      if (std::stoi(local.substr(colon + 1), nullptr, 16) != port) continue;
      found = true;
      const std::string host = local.substr(0, colon);
      loopback = loopback && (host == "0100007F" || host == "00000000000000000000000001000000" ||
                              host == "0000000000000000FFFF00000100007F");
    }
  }
  CHECK(found);
  CHECK(loopback);
  run.signal(SIGTERM);
  CHECK(run.wait(30).has_value());
}

namespace {
// "rank=R ... checksum=C" lines by rank.
std::map<int, std::string> result_lines(const std::string& output) {
  std::map<int, std::string> lines;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    const auto at = line.find("rank=");
    if (at == std::string::npos) continue;
    lines[std::stoi(line.substr(at + 5))] = line.substr(at);
  }
  return lines;
}
}  // namespace

TEST_CASE("Fabric::launch: devices(2) in code behaves as lightning-run --devices 2", "[launch]") {
  Launched alone(lf_test::program_path(), {"--devices", "2"});
  REQUIRE(alone.wait(120) == 0);
  Launched launched(lf_test::launcher_path(), {"model", "--accelerator", "cpu", "--devices", "2", lf_test::program_path()});
  REQUIRE(launched.wait(120) == 0);
  const auto a = result_lines(alone.out());
  const auto b = result_lines(launched.out());
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 2);
  CHECK_THAT(a.at(0), Contains("world=2 strategy=ddp"));
  CHECK(a.at(0) == b.at(0));
  CHECK(a.at(1) == b.at(1));
  // DDP keeps the replicas identical although each rank saw different data.
  CHECK(a.at(0).substr(a.at(0).find("checksum")) == a.at(1).substr(a.at(1).find("checksum")));
  check_no_leftovers(alone);
  check_no_leftovers(launched);
}

TEST_CASE("Fabric::launch: an explicit launch() works alone and is refused under lightning-run", "[launch]") {
  Launched alone(lf_test::program_path(), {"--devices", "2", "--launch"});
  REQUIRE(alone.wait(120) == 0);
  CHECK(result_lines(alone.out()).size() == 2);
  Launched refused(lf_test::launcher_path(), {"model", "--accelerator", "cpu", "--devices", "2", lf_test::program_path(), "--launch"});
  CHECK(refused.wait(60) != 0);
  CHECK_THAT(refused.err(), Contains("LT_CLI_USED=1"));
  check_no_leftovers(refused);
}

TEST_CASE("launcher: a strategy the program registers itself is chosen through LT_STRATEGY", "[launcher][choices]") {
  // lightning-run cannot know it (it never loads the program): the flag is refused with the way out...
  Launched refused(lf_test::launcher_path(), {"model", "--accelerator", "cpu", "--devices", "2", "--strategy",
                                              "counting_ddp", lf_test::program_path(), "--register-strategy"});
  CHECK(refused.wait(60) == 2);
  CHECK_THAT(refused.err(), Contains("--strategy=counting_ddp is not valid") && Contains("LT_STRATEGY"));
  // ...and the exported variable reaches the workers, whose Connector knows the registration.
  Launched chosen(lf_test::launcher_path(), {"model", "--accelerator", "cpu", "--devices", "2", lf_test::program_path(),
                                             "--register-strategy"},
                  {{"LT_STRATEGY", "counting_ddp"}});
  REQUIRE(chosen.wait(120) == 0);
  const auto lines = result_lines(chosen.out());
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines.at(0), Contains("world=2 strategy=counting_ddp"));
  // Without the registration the same variable is the Connector's error, naming the choices.
  Launched unknown(lf_test::launcher_path(), {"model", "--accelerator", "cpu", "--devices", "2", lf_test::program_path()},
                   {{"LT_STRATEGY", "counting_ddp"}});
  CHECK(unknown.wait(120) != 0);
  CHECK_THAT(unknown.all(), Contains("counting_ddp") && Contains("fsdp"));
  check_no_leftovers(unknown);
}

TEST_CASE("Fabric::launch: a failing child stops the job with its exit code", "[launch]") {
  Launched run(lf_test::program_path(), {"--devices", "2", "--fail-rank", "1"});
  CHECK(run.wait(120) == 3);
  CHECK_THAT(run.err(), Contains("local rank 1 failed: exit code 3"));
  check_no_leftovers(run);
}

TEST_CASE("the same binary runs under hand-made srun-like and mpirun-like environments", "[launch][environments]") {
  Launched reference(lf_test::launcher_path(), {"model", "--accelerator", "cpu", "--devices", "2", lf_test::program_path()});
  REQUIRE(reference.wait(120) == 0);
  const auto expected = result_lines(reference.out());
  REQUIRE(expected.size() == 2);
  const std::string port = std::to_string(lf_test::free_port());
  const std::vector<std::map<std::string, std::string>> schedulers = {
      {{"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_NODEID", "0"},
       {"SLURM_NODELIST", "localhost"}, {"SLURM_JOB_ID", "77"}, {"MASTER_PORT", port}},
      {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", port}}};
  for (const auto& common : schedulers) {
    const bool slurm = common.count("SLURM_NTASKS") != 0;
    INFO((slurm ? "srun-like" : "mpirun-like"));
    std::vector<std::unique_ptr<Launched>> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      auto env = common;
      env[slurm ? "SLURM_PROCID" : "OMPI_COMM_WORLD_RANK"] = std::to_string(rank);
      env[slurm ? "SLURM_LOCALID" : "OMPI_COMM_WORLD_LOCAL_RANK"] = std::to_string(rank);
      ranks.push_back(std::make_unique<Launched>(lf_test::program_path(), std::vector<std::string>{"--devices", "2"}, env));
    }
    for (int rank = 0; rank < 2; ++rank) {
      REQUIRE(ranks[rank]->wait(120) == 0);
      const auto lines = result_lines(ranks[rank]->out());
      REQUIRE(lines.count(rank) == 1);
      CHECK(lines.at(rank) == expected.at(rank));
    }
  }
}
