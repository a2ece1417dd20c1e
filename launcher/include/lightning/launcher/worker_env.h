// The environment each worker gets (docs/launcher.md): the parent's, plus the LT_* variables and the
// torchrun set. Pinned by tests on both sides through lightning/fabric/utilities/env_vars.h.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "lightning/fabric/utilities/launch_env.h"
#include "lightning/launcher/args.h"

namespace lightning::launcher {

/// Where this node stands in the job, as the rendezvous established it.
using NodeLayout = fabric::WorkerLayout;

/// OMP_NUM_THREADS for each worker when the parent has none: max(1, cores / local workers).
int default_omp_threads(int local_world_size);

/// The full environment of one worker. error_file: its TORCHELASTIC_ERROR_FILE path.
std::map<std::string, std::string> worker_environment(const LaunchArgs& args, const NodeLayout& layout,
                                                      int local_rank, std::map<std::string, std::string> parent,
                                                      const std::string& error_file);

}  // namespace lightning::launcher
