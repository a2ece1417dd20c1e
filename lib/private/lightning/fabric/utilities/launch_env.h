// The environment of one worker, built by one function for lightning-run (launcher/) and for
// Fabric::launch() (strategies/launchers/), so that a program sees the same contract either way
// (docs/launcher.md). What the two launchers deliberately do differently is a WorkerSettings field.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lightning::fabric {

/// Where a node stands in the job.
struct WorkerLayout {
  int node_rank = 0;
  int num_nodes = 1;
  int local_world_size = 1;
  int rank_offset = 0;  // global rank of this node's local rank 0
  int world_size = 1;
  std::string main_address = "127.0.0.1";
  int main_port = 29400;
  std::string run_id;
  int restart_count = 0;  // restarts after a failure (TORCHELASTIC_RESTART_COUNT)
  int max_restarts = 0;
  int attempt = 0;        // every start of the workers, membership changes too (LT_ATTEMPT)
};

/// Places node `node_rank` in a job whose nodes run local_world_sizes[n] processes each: sets
/// num_nodes, local_world_size, rank_offset (the processes of the nodes before it) and world_size.
/// lightning-run calls it with the counts its nodes published, Fabric::launch() with equal counts.
void place_node(WorkerLayout& layout, int node_rank, const std::vector<int>& local_world_sizes);

/// RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, NODE_RANK,
/// ROLE_RANK, ROLE_NAME, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
/// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS written into env (others untouched).
void add_torchrun_environment(std::map<std::string, std::string>& env, const WorkerLayout& layout, int local_rank);

/// What differs between lightning-run's workers and the processes Fabric::launch() starts. The
/// defaults are those of the processes Fabric::launch() spawns; lightning-run fills every field.
struct WorkerSettings {
  /// lightning-run's Fabric flags, as given. Set: LT_CLI_USED=1, LT_DEVICES, LT_NUM_NODES (the
  /// layout's), LT_ATTEMPT (the layout's), and each of LT_ACCELERATOR, LT_STRATEGY, LT_PRECISION
  /// whose flag was given.
  /// Fabric::launch() leaves it unset: its processes take the options from the code, as it did.
  struct Cli {
    std::optional<std::string> accelerator;
    std::optional<std::string> strategy;
    std::optional<std::string> precision;
    std::string devices = "1";
  };
  std::optional<Cli> cli;
  /// TORCHELASTIC_USE_AGENT_STORE: "True" when the launcher hosts the store and workers join it
  /// (lightning-run), "False" when global rank 0 hosts it (Fabric::launch()). Always set.
  bool agent_store = false;
  /// TORCHELASTIC_ERROR_FILE: where the worker records an uncaught exception. Empty: not set
  /// (Fabric::launch()'s own process, local rank 0, whose failure is its own to report).
  std::string error_file;
  /// LT_HANG_TIMEOUT ("2", "0.5"), LT_STRAGGLER_THRESHOLD, LT_CHECK_COLLECTIVES=1,
  /// LT_PROCESS_GROUP_BACKEND: lightning-run's --hang-timeout, --straggler-threshold,
  /// --check-collectives, --process-group-backend, set only when given. Unset or false, the
  /// parent's values pass through (Fabric::launch()'s processes inherit its own).
  std::optional<double> hang_timeout_s;
  std::optional<double> straggler_threshold_s;
  bool check_collectives = false;
  std::optional<std::string> process_group_backend;
  /// LT_PROFILE, LT_PROFILE_RANKS, LT_PROFILE_DIR (utilities/profiler.h): lightning-run's --profile
  /// and --profile-ranks, and the folder it chose; set only when given.
  std::optional<std::string> profile, profile_ranks, profile_dir;
  /// OMP_NUM_THREADS=default_omp_threads(local_world_size) when the parent has none. False for
  /// Fabric::launch()'s own process, which already runs and sets LibTorch's thread count instead.
  bool set_omp_threads = true;
  /// lightning-run --virtual-local-rank (torchrun's): LOCAL_RANK=0 in every worker and
  /// LT_VIRTUAL_LOCAL_RANK=1. With virtual_gpus (a CUDA job: the GPU index of each local rank, as
  /// the launcher sees them), also CUDA_VISIBLE_DEVICES = entry virtual_gpus[local rank] of the
  /// parent's CUDA_VISIBLE_DEVICES (that index itself when the parent has none), so that the
  /// worker sees its one GPU as device 0. A parent list without that entry: ValueError.
  bool virtual_local_rank = false;
  std::vector<int> virtual_gpus;
};

/// OMP_NUM_THREADS for each worker when the parent has none: max(1, cores / local workers).
int default_omp_threads(int local_world_size);

/// The full environment of local rank `local_rank`: `parent` (the environment it inherits), plus
/// what `settings` asks for (with cli: LT_ATTEMPT too) and the torchrun set of add_torchrun_environment. Variables it sets
/// replace the parent's; the others pass through untouched.
std::map<std::string, std::string> worker_environment(const WorkerSettings& settings, const WorkerLayout& layout,
                                                      int local_rank, std::map<std::string, std::string> parent);

}  // namespace lightning::fabric
