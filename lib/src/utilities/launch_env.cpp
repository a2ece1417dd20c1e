#include "lightning/fabric/utilities/launch_env.h"

#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric {

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

}  // namespace lightning::fabric
