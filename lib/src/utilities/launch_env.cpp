#include "lightning/fabric/utilities/launch_env.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric {
namespace {

// "2", "0.5": seconds as a person writes them (as lightning-run's format_seconds).
std::string seconds_number(double seconds) {
  std::ostringstream text;
  text << seconds;
  return text.str();
}

// LT_CLI_USED and the flags lightning-run was given.
void add_cli_environment(std::map<std::string, std::string>& vars, const WorkerSettings::Cli& cli, int num_nodes) {
  vars[env::kCliUsed] = "1";
  if (cli.accelerator) vars[env::kAccelerator] = *cli.accelerator;
  if (cli.strategy) vars[env::kStrategy] = *cli.strategy;
  if (cli.precision) vars[env::kPrecision] = *cli.precision;
  vars[env::kDevices] = cli.devices;
  vars[env::kNumNodes] = std::to_string(num_nodes);
}

// --virtual-local-rank: the CUDA_VISIBLE_DEVICES entry of GPU `gpu`, as torchrun maps it through the
// parent's list (its entries stripped of blanks); without a parent list, the index itself.
std::string visible_device(const std::map<std::string, std::string>& parent, int gpu) {
  const auto inherited = parent.find(env::kCudaVisibleDevices);
  if (inherited == parent.end()) return std::to_string(gpu);
  std::vector<std::string> entries;
  std::stringstream items(inherited->second);
  for (std::string item; std::getline(items, item, ',');) {
    const auto begin = item.find_first_not_of(" \t");
    entries.push_back(begin == std::string::npos ? "" : item.substr(begin, item.find_last_not_of(" \t") - begin + 1));
  }
  LF_CHECK(gpu >= 0 && gpu < static_cast<int>(entries.size()), ValueError, "--virtual-local-rank: a worker uses GPU ",
           gpu, ", but CUDA_VISIBLE_DEVICES=\"", inherited->second, "\" lists ", entries.size(),
           " GPU(s). List every GPU the job uses there, or unset it.");
  return entries[static_cast<size_t>(gpu)];
}

}  // namespace

void place_node(WorkerLayout& layout, int node_rank, const std::vector<int>& local_world_sizes) {
  layout.node_rank = node_rank;
  layout.num_nodes = static_cast<int>(local_world_sizes.size());
  layout.local_world_size = local_world_sizes.at(static_cast<size_t>(node_rank));
  layout.rank_offset = 0;
  layout.world_size = 0;
  for (int node = 0; node < layout.num_nodes; ++node) {
    if (node < node_rank) layout.rank_offset += local_world_sizes[static_cast<size_t>(node)];
    layout.world_size += local_world_sizes[static_cast<size_t>(node)];
  }
}

void add_torchrun_environment(std::map<std::string, std::string>& vars, const WorkerLayout& layout, int local_rank) {
  const std::string rank = std::to_string(layout.rank_offset + local_rank);
  vars[env::kRank] = rank;
  vars[env::kLocalRank] = std::to_string(local_rank);
  vars[env::kWorldSize] = std::to_string(layout.world_size);
  vars[env::kLocalWorldSize] = std::to_string(layout.local_world_size);
  vars[env::kGroupRank] = std::to_string(layout.node_rank);
  vars[env::kGroupWorldSize] = std::to_string(layout.num_nodes);
  vars[env::kNodeRank] = std::to_string(layout.node_rank);
  vars[env::kRoleRank] = rank;
  vars[env::kRoleName] = "default";
  vars[env::kRoleWorldSize] = std::to_string(layout.world_size);
  vars[env::kMasterAddr] = layout.main_address;
  vars[env::kMasterPort] = std::to_string(layout.main_port);
  vars[env::kRunId] = layout.run_id;
  vars[env::kRestartCount] = std::to_string(layout.restart_count);
  vars[env::kMaxRestarts] = std::to_string(layout.max_restarts);
}

int default_omp_threads(int local_world_size) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, local_world_size));
}

std::map<std::string, std::string> worker_environment(const WorkerSettings& settings, const WorkerLayout& layout,
                                                      int local_rank, std::map<std::string, std::string> parent) {
  auto& vars = parent;
  if (settings.cli) add_cli_environment(vars, *settings.cli, layout.num_nodes);
  add_torchrun_environment(vars, layout, local_rank);
  if (settings.virtual_local_rank) {
    vars[env::kLocalRank] = "0";
    vars[env::kVirtualLocalRank] = "1";
    if (local_rank >= 0 && static_cast<size_t>(local_rank) < settings.virtual_gpus.size()) {
      const std::string device = visible_device(vars, settings.virtual_gpus[static_cast<size_t>(local_rank)]);
      vars[env::kCudaVisibleDevices] = device;
    }
  }
  vars[env::kUseAgentStore] = settings.agent_store ? "True" : "False";
  if (settings.cli) vars[env::kAttempt] = std::to_string(layout.attempt);  // lightning-run's restarts and regroups
  if (!settings.error_file.empty()) vars[env::kErrorFile] = settings.error_file;
  if (settings.hang_timeout_s) vars[env::kHangTimeout] = seconds_number(*settings.hang_timeout_s);
  if (settings.straggler_threshold_s) vars[env::kStragglerThreshold] = seconds_number(*settings.straggler_threshold_s);
  if (settings.check_collectives) vars[env::kCheckCollectives] = "1";
  if (settings.process_group_backend) vars[env::kProcessGroupBackend] = *settings.process_group_backend;
  if (settings.profile) vars[env::kProfile] = *settings.profile;
  if (settings.profile_ranks) vars[env::kProfileRanks] = *settings.profile_ranks;
  if (settings.profile_dir) vars[env::kProfileDir] = *settings.profile_dir;
  if (settings.set_omp_threads && vars.count("OMP_NUM_THREADS") == 0) {
    vars["OMP_NUM_THREADS"] = std::to_string(default_omp_threads(layout.local_world_size));
  }
  return parent;
}

}  // namespace lightning::fabric
