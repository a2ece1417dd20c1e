// The torchrun variables of one worker, built from where its node stands in the job. Shared by
// lightning-run (launcher/) and Fabric::launch() (strategies/launchers/), so that a program sees
// the same contract either way (docs/launcher.md).
#pragma once

#include <map>
#include <string>

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
  int restart_count = 0;
  int max_restarts = 0;
};

/// RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, NODE_RANK,
/// ROLE_RANK, ROLE_NAME, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
/// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS written into env (others untouched).
void add_torchrun_environment(std::map<std::string, std::string>& env, const WorkerLayout& layout, int local_rank);

}  // namespace lightning::fabric
