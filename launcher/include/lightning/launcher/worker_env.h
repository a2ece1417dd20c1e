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

/// What depends on the attempt's folder: LT_FLIGHT_DIR (one node: the ranks' flight recorders
/// live there and lightning-run judges hangs) and LT_HANG_DUMP_DIR (<folder>/hang, unless the
/// user set it: where ranks of a multi-node job write hang dumps).
void add_attempt_environment(std::map<std::string, std::string>& vars, const std::string& attempt_dir, int num_nodes);

}  // namespace lightning::launcher
