// A tiny worker for the launcher tests: it does one thing per mode, reading its rank from the
// environment lightning-run sets.
//   env            print every variable of the contract as KEY=VALUE lines
//   args A B ...   print its arguments, one per line
//   barrier        join the launcher's store, pass a gloo barrier, print "rank R passed barrier"
//   exit R CODE    rank R exits with CODE at once; the others wait in a barrier
//   throw R        rank R throws an uncaught std::runtime_error (the error file records it)
//   segv R         rank R dies of SIGSEGV
//   save-on-signal R  every rank saves (200 ms) on SIGTERM/SIGINT and prints it; rank R exits 3 after 1 s
//   hang R         rank R sleeps forever before joining, the others wait for it (rendezvous timeout 5 s)
//   hang-alone R   rank R sleeps forever, the others exit 0 at once
//   fail-first R   rank R exits 3 on attempt 0 (TORCHELASTIC_RESTART_COUNT), then all succeed
//   wait-signal    print "ready", then wait; SIGUSR1 prints "got SIGUSR1"; SIGTERM exits 0
//   print N        print N numbered lines on stdout and one on stderr
//   exit-later R C rank R exits with C after 1 s; the others wait until a signal ends them
//   affinity       print "affinity R: LIST" (the CPUs it may run on, /proc/self/status's
//                  Cpus_allowed_list) and "mempolicy R: MODE" (get_mempolicy's mode; 1 = preferred)
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/utilities/env_vars.h"
#include "lightning/fabric/utilities/error_file.h"

namespace env = lightning::fabric::env;

namespace {
int int_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : -1;
}

// Joins the launcher's store as torchrun workers do and passes one gloo barrier.
void barrier(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  lightning::fabric::CollectiveOptions options;
  options.settings = lightning::fabric::with_environment_overrides({}, lightning::fabric::env::process_env());  // GLOO_SOCKET_IFNAME, LT_*
  options.main_address = std::getenv(env::kMasterAddr);
  options.main_port = int_env(env::kMasterPort);
  options.rank = int_env(env::kRank);
  options.world_size = int_env(env::kWorldSize);
  options.store_attempt = int_env(env::kRestartCount);
  options.use_agent_store = true;
  options.settings.timeout = timeout;
  options.settings.rendezvous_timeout = timeout;  // a rank that never joins ends the wait as a stuck barrier would
  lightning::fabric::Collective group(options);
  group.barrier();
}

volatile std::sig_atomic_t got_usr1 = 0;
volatile std::sig_atomic_t got_term = 0;
}  // namespace

int main(int argc, char** argv) {
  lightning::fabric::install_error_file_handler();
  const std::string mode = argc > 1 ? argv[1] : "env";
  const int rank = int_env(env::kRank);
  const int target = argc > 2 ? std::atoi(argv[2]) : -1;
  if (mode == "env") {
    for (const char* name : {env::kCliUsed, env::kAccelerator, env::kStrategy, env::kPrecision, env::kDevices,
                             env::kNumNodes, env::kRank, env::kLocalRank, env::kWorldSize, env::kLocalWorldSize,
                             env::kGroupRank, env::kGroupWorldSize, env::kNodeRank, env::kRoleRank, env::kRoleName,
                             env::kRoleWorldSize, env::kMasterAddr, env::kMasterPort, env::kRunId, env::kRestartCount,
                             env::kMaxRestarts, env::kErrorFile, env::kUseAgentStore, env::kVirtualLocalRank,
                             env::kCudaVisibleDevices, "OMP_NUM_THREADS", "LF_TEST_INHERITED"}) {
      const char* value = std::getenv(name);
      if (value != nullptr) std::cout << name << "=" << value << "\n";
    }
    return 0;
  }
  if (mode == "affinity") {
    std::ifstream status("/proc/self/status");
    std::string line, cpus = "?";
    while (std::getline(status, line)) {
      if (line.rfind("Cpus_allowed_list:", 0) == 0) cpus = line.substr(line.find_first_not_of(" \t", 18));
    }
    int policy = -1;
    if (syscall(SYS_get_mempolicy, &policy, nullptr, 0UL, nullptr, 0UL) != 0) policy = -1;
    std::cout << "affinity " << rank << ": " << cpus << "\nmempolicy " << rank << ": " << policy << std::endl;
    return 0;
  }
  if (mode == "args") {
    for (int i = 2; i < argc; ++i) std::cout << "arg=" << argv[i] << "\n";
    return 0;
  }
  if (mode == "barrier") {
    barrier();
    std::cout << "rank " << rank << " passed barrier" << std::endl;
    return 0;
  }
  if (mode == "print") {
    for (int i = 0; i < target; ++i) std::cout << "line " << i << " of rank " << rank << "\n";
    std::cerr << "stderr of rank " << rank << std::endl;
    return 0;
  }
  if (mode == "wait-signal") {
    std::signal(SIGUSR1, [](int) { got_usr1 = 1; });
    std::signal(SIGTERM, [](int) { got_term = 1; });
    std::cout << "ready " << rank << std::endl;
    while (got_term == 0) {
      if (got_usr1 != 0) {
        got_usr1 = 0;
        std::cout << "got SIGUSR1 " << rank << std::endl;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return 0;
  }
  if (mode == "save-on-signal") {
    // A program that saves on SIGTERM/SIGINT: the handler's work (200 ms) must finish within the
    // launcher's grace period; rank `target` instead fails with exit code 3 after 1 s.
    std::signal(SIGTERM, [](int) { got_term = SIGTERM; });
    std::signal(SIGINT, [](int) { got_term = SIGINT; });
    std::cout << "ready " << rank << std::endl;
    const auto start = std::chrono::steady_clock::now();
    while (got_term == 0) {
      if (rank == target && std::chrono::steady_clock::now() - start > std::chrono::seconds(1)) return 3;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::cout << "rank " << rank << " saved after signal " << static_cast<int>(got_term) << std::endl;
    return 0;
  }
  if (mode == "exit-later") {
    std::cout << "ready " << rank << std::endl;
    if (rank == target) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      return std::atoi(argv[3]);
    }
    while (true) pause();
  }
  if (rank == target) {
    if (mode == "exit") return std::atoi(argv[3]);
    if (mode == "throw") throw std::runtime_error("boom from rank " + std::to_string(rank));
    if (mode == "segv") std::raise(SIGSEGV);
    if (mode == "hang" || mode == "hang-alone") {
      std::cout << "rank " << rank << " hangs" << std::endl;
      while (true) pause();
    }
    if (mode == "fail-first" && int_env(env::kRestartCount) == 0) return 3;
  }
  if (mode == "hang-alone") return 0;
  if (mode == "hang") {
    barrier(std::chrono::seconds(5));
    return 0;
  }
  if (mode == "fail-first") {
    barrier();
    std::cout << "rank " << rank << " finished attempt " << int_env(env::kRestartCount) << std::endl;
    return 0;
  }
  // exit / throw / segv: the others wait in a collective for the failed rank.
  barrier(std::chrono::seconds(60));
  return 0;
}
