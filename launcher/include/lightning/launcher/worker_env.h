// The environment each worker gets (docs/launcher.md): the parent's, plus the LT_* variables and the
// torchrun set, built by fabric::worker_environment (lightning/fabric/utilities/launch_env.h), the
// function Fabric::launch() uses too. Pinned by tests on both sides through env_vars.h.
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
using fabric::default_omp_threads;

/// lightning-run's worker settings: its Fabric flags (LT_CLI_USED=1 and the LT_* choices), the
/// agent store, --hang-timeout, --check-collectives, --process-group-backend, the OMP default,
/// --virtual-local-rank (with each local rank's GPU on CUDA).
/// error_file: the worker's TORCHELASTIC_ERROR_FILE path.
fabric::WorkerSettings worker_settings(const LaunchArgs& args, const std::string& error_file);

/// The full environment of one worker: fabric::worker_environment with worker_settings(args, error_file).
std::map<std::string, std::string> worker_environment(const LaunchArgs& args, const NodeLayout& layout,
                                                      int local_rank, std::map<std::string, std::string> parent,
                                                      const std::string& error_file);

/// What depends on the attempt's folder: LT_FLIGHT_DIR (the ranks' flight recorders live there,
/// read by lightning-run for `lightning-run status`), LT_HANG_JUDGE (launcher on one node, where
/// lightning-run judges hangs from the recorders; ranks on several) and LT_HANG_DUMP_DIR
/// (<folder>/hang, unless the user set it: where ranks of a multi-node job write hang dumps).
void add_attempt_environment(std::map<std::string, std::string>& vars, const std::string& attempt_dir, int num_nodes);

/// Who judges hangs, the one rule both sides follow: lightning-run on a job of one node (it maps
/// every rank's recorder), else rank 0 through the store (LT_HANG_JUDGE says which to the ranks).
inline bool launcher_judges_hangs(int num_nodes) { return num_nodes == 1; }

}  // namespace lightning::launcher
