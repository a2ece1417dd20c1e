#include "lightning/fabric/strategies/launchers/subprocess_launcher.h"

#include <ATen/Parallel.h>
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/utilities/error_file.h"
#include "lightning/fabric/utilities/launch_env.h"
#include "lightning/fabric/utilities/process.h"

namespace lightning::fabric {
namespace {

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> words;
  std::string word;
  while (std::getline(in, word, '\0')) words.push_back(word);
  return words;
}

constexpr auto kGrace = std::chrono::seconds(5);

// Where local rank `local_rank` records an uncaught exception; the monitor reads it back.
std::string error_file_of(const std::string& error_dir, int local_rank) {
  return error_dir + "/rank_" + std::to_string(local_rank) + ".error.json";
}

}  // namespace

WorkerSettings SubprocessLauncher::worker_settings(int local_rank, const std::string& error_dir, bool set_omp_threads) {
  WorkerSettings settings;  // no CLI choices; rank 0 hosts the store (TORCHELASTIC_USE_AGENT_STORE=False)
  const bool spawned = local_rank > 0;  // this process, local rank 0, keeps its error file and threads
  if (spawned) settings.error_file = error_file_of(error_dir, local_rank);
  settings.set_omp_threads = spawned && set_omp_threads;
  return settings;
}

struct SubprocessLauncher::Impl {
  int num_processes = 1;
  int num_nodes = 1;
  env::EnvLookup env;
  c10::intrusive_ptr<c10d::Store> store;
  std::string error_dir;
  std::vector<ChildProcess> children;
  std::thread monitor;
  std::mutex mutex;
  std::condition_variable spawned_cv;
  bool spawned = false;
  std::exception_ptr spawn_error;
  std::atomic<bool> reporting{false};  // the monitor saw a child fail and is stopping the job

  // Runs on the monitor thread, which lives as long as the children: PR_SET_PDEATHSIG is bound
  // to the thread that forked, so the children die with this process and never outlive it.
  // A guardian tears the children's process groups down if this process is killed outright.
  void supervise(std::vector<ProcessSpec> specs) {
    std::optional<ProcessGuardian> guardian;
    try {
      guardian.emplace();
      for (auto& spec : specs) {
        spec.guardian_pipe = guardian->pipe();
        children.push_back(ChildProcess::spawn(spec));
      }
    } catch (...) {
      spawn_error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      spawned = true;
    }
    spawned_cv.notify_all();
    if (spawn_error) return;
    while (auto index = wait_any(children, std::chrono::milliseconds(-1))) {
      const ExitStatus status = *children[*index].status();
      if (status.success()) continue;
      report_and_exit(*index + 1, status);
    }
  }

  [[noreturn]] void report_and_exit(size_t local_rank, const ExitStatus& status) {
    reporting = true;
    std::cerr << "lightning-fabric: local rank " << local_rank << " failed: " << status.describe() << "\n";
    const std::string error = read_error_file(error_file_of(error_dir, static_cast<int>(local_rank)));
    if (!error.empty()) std::cerr << "lightning-fabric: its error file says: " << error << "\n";
    std::cerr << "lightning-fabric: stopping the other processes and exiting with " << status.shell_code() << std::endl;
    terminate_all(children, SIGTERM, kGrace);
    std::_Exit(status.shell_code());
  }
};

SubprocessLauncher::SubprocessLauncher(int num_processes, int num_nodes, env::EnvLookup env)
    : impl_(std::make_shared<Impl>()) {
  impl_->num_processes = num_processes;
  impl_->num_nodes = num_nodes;
  impl_->env = std::move(env);
}

SubprocessLauncher::~SubprocessLauncher() = default;

const c10::intrusive_ptr<c10d::Store>& SubprocessLauncher::hosted_store() const { return impl_->store; }

void SubprocessLauncher::launch() {
  Impl& impl = *impl_;
  const auto& env = impl.env;
  WorkerLayout layout;
  const env::Reader reader(env);
  auto node_rank = reader.integer(env::kNodeRank, 0, impl.num_nodes - 1);
  if (!node_rank) node_rank = reader.integer(env::kGroupRank, 0, impl.num_nodes - 1);
  place_node(layout, static_cast<int>(node_rank.value_or(0)), std::vector<int>(impl.num_nodes, impl.num_processes));
  layout.main_address = reader.text(env::kMasterAddr).value_or("127.0.0.1");
  const auto port = reader.integer(env::kMasterPort, 0, 65535);
  LF_CHECK(port || impl.num_nodes == 1, ValueError, "Fabric::launch() with num_nodes=", impl.num_nodes,
           " needs MASTER_ADDR and MASTER_PORT (node 0's address and a free port) and NODE_RANK on every node, "
           "or start the nodes with lightning-run.");
  layout.main_port = static_cast<int>(port.value_or(0));
  layout.run_id = "fabric-launch-" + std::to_string(getpid());
  if (layout.node_rank == 0) {
    int bound = 0;
    impl.store = host_store(layout.main_address, layout.main_port, std::chrono::minutes(30), &bound);
    layout.main_port = bound;
  }

  impl.error_dir = make_temporary_directory("lightning-fabric-");

  const bool set_threads = !reader.text("OMP_NUM_THREADS").has_value();
  std::vector<ProcessSpec> specs;
  const auto command = own_command_line();
  for (int local = 1; local < impl.num_processes; ++local) {
    ProcessSpec spec;
    spec.executable = "/proc/self/exe";
    spec.argv = command;
    spec.env = worker_environment(worker_settings(local, impl.error_dir, set_threads), layout, local,
                                  current_environment());
    specs.push_back(std::move(spec));
  }
  // This process becomes local rank 0 of the same contract: what the function adds is exported.
  const auto own = worker_environment(worker_settings(0, impl.error_dir, set_threads), layout, 0, {});
  for (const auto& [key, value] : own) setenv(key.c_str(), value.c_str(), 1);
  if (set_threads) at::set_num_threads(default_omp_threads(impl.num_processes));

  impl.monitor = std::thread([state = impl_, specs = std::move(specs)]() mutable { state->supervise(std::move(specs)); });
  {
    std::unique_lock<std::mutex> lock(impl.mutex);
    impl.spawned_cv.wait(lock, [&] { return impl.spawned; });
  }
  if (impl.spawn_error) {
    impl.monitor.join();
    std::rethrow_exception(impl.spawn_error);
  }
  // At a normal exit of local rank 0, wait for the other ranks (the monitor stops the job if one
  // of them fails meanwhile).
  static std::shared_ptr<Impl> waiting;
  waiting = impl_;
  // Rank 0 often dies of a failed child (a collective loses its peer) before the monitor has seen
  // the child's exit: give the monitor a moment to report the child and exit with its code.
  install_error_file_handler();
  // Up to 2 s for the monitor to notice a failed child; once it reports, it exits the process
  // itself after stopping the others (at most the grace), so wait for that.
  set_terminate_hook([] {
    if (!waiting) return;
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < std::chrono::seconds(2) || waiting->reporting) {
      if (std::chrono::steady_clock::now() - start > kGrace + std::chrono::seconds(5)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::atexit([] {
    if (waiting && waiting->monitor.joinable()) waiting->monitor.join();
    std::error_code ignored;
    if (waiting) std::filesystem::remove_all(waiting->error_dir, ignored);
  });
}

}  // namespace lightning::fabric
