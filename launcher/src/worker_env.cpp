#include "lightning/launcher/worker_env.h"

#include <filesystem>

#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::launcher {

namespace env = fabric::env;

fabric::WorkerSettings worker_settings(const LaunchArgs& args, const std::string& error_file) {
  fabric::WorkerSettings settings;
  settings.cli = fabric::WorkerSettings::Cli{args.accelerator, args.strategy, args.precision, args.devices};
  settings.agent_store = true;
  settings.error_file = error_file;
  settings.hang_timeout_s = args.hang_timeout_s;
  settings.straggler_threshold_s = args.straggler_threshold_s;
  settings.check_collectives = args.check_collectives;
  settings.process_group_backend = args.process_group_backend;
  settings.profile = args.profile;
  settings.profile_ranks = args.profile_ranks;
  if (args.profile) {
    const std::filesystem::path base = args.log_dir ? std::filesystem::path(*args.log_dir) : std::filesystem::current_path();
    settings.profile_dir = std::filesystem::absolute(base / "profile").string();
  }
  settings.set_omp_threads = true;
  settings.virtual_local_rank = args.virtual_local_rank;
  if (args.virtual_local_rank) settings.virtual_gpus = local_gpu_indices(args);  // empty unless CUDA
  return settings;
}

std::map<std::string, std::string> worker_environment(const LaunchArgs& args, const NodeLayout& layout,
                                                      int local_rank, std::map<std::string, std::string> parent,
                                                      const std::string& error_file) {
  return fabric::worker_environment(worker_settings(args, error_file), layout, local_rank, std::move(parent));
}

void add_attempt_environment(std::map<std::string, std::string>& vars, const std::string& attempt_dir, int num_nodes) {
  vars[env::kFlightDir] = attempt_dir;
  vars[env::kHangJudge] = launcher_judges_hangs(num_nodes) ? "launcher" : "ranks";
  if (vars.count(env::kHangDumpDir) == 0) vars[env::kHangDumpDir] = attempt_dir + "/hang";
  vars[env::kStepTimesDir] = attempt_dir;
}

}  // namespace lightning::launcher
