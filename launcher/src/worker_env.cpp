#include "lightning/launcher/worker_env.h"

#include <algorithm>
#include <thread>

#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::launcher {

namespace env = fabric::env;

int default_omp_threads(int local_world_size) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, local_world_size));
}

std::map<std::string, std::string> worker_environment(const LaunchArgs& args, const NodeLayout& layout,
                                                      int local_rank, std::map<std::string, std::string> parent,
                                                      const std::string& error_file) {
  auto& vars = parent;
  vars[env::kCliUsed] = "1";
  if (args.accelerator) vars[env::kAccelerator] = *args.accelerator;
  if (args.strategy) vars[env::kStrategy] = *args.strategy;
  if (args.precision) vars[env::kPrecision] = *args.precision;
  vars[env::kDevices] = args.devices;
  vars[env::kNumNodes] = std::to_string(layout.num_nodes);

  fabric::add_torchrun_environment(vars, layout, local_rank);
  vars[env::kErrorFile] = error_file;
  vars[env::kUseAgentStore] = "True";
  if (args.hang_timeout_s) vars[env::kHangTimeout] = format_seconds(*args.hang_timeout_s);
  if (args.check_collectives) vars[env::kCheckCollectives] = "1";
  if (args.process_group_backend) vars[env::kProcessGroupBackend] = *args.process_group_backend;
  if (vars.count("OMP_NUM_THREADS") == 0) vars["OMP_NUM_THREADS"] = std::to_string(default_omp_threads(layout.local_world_size));
  return parent;
}

void add_attempt_environment(std::map<std::string, std::string>& vars, const std::string& attempt_dir, int num_nodes) {
  if (num_nodes == 1) vars[env::kFlightDir] = attempt_dir;
  if (vars.count(env::kHangDumpDir) == 0) vars[env::kHangDumpDir] = attempt_dir + "/hang";
}

}  // namespace lightning::launcher
