// Fabric::launch() without a launcher: re-executes the current program once per extra local
// rank with the environment lightning-run would give it (one function builds both:
// fabric::worker_environment in launch_env.h, with worker_settings below), supervises the
// children with the launcher's process code, and lets this process continue as local rank 0.
// When a child fails, the others and this process are stopped and the job exits with the child's
// code (or 128 + signal); when this process exits normally it first waits for its children.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <string>

#include "lightning/fabric/utilities/env_vars.h"
#include "lightning/fabric/utilities/launch_env.h"

namespace c10d {
class Store;
}

namespace lightning::fabric {

class SubprocessLauncher {
 public:
  /// num_processes: local processes of this node (this one included).
  SubprocessLauncher(int num_processes, int num_nodes, env::EnvLookup env);
  ~SubprocessLauncher();

  /// Hosts the store (node 0), spawns local ranks 1..n-1, exports this process's own rank
  /// variables. Called once, from Fabric::launch().
  void launch();
  /// The store this process hosts for the job (node 0 only; null elsewhere).
  const c10::intrusive_ptr<c10d::Store>& hosted_store() const;

  /// What launch() passes to fabric::worker_environment for local rank `local_rank`: no CLI
  /// choices (LT_CLI_USED unset), TORCHELASTIC_USE_AGENT_STORE=False (global rank 0 hosts the
  /// store); a spawned rank (>= 1) gets <error_dir>/rank_<local_rank>.error.json as its
  /// TORCHELASTIC_ERROR_FILE and, when set_omp_threads (OMP_NUM_THREADS was unset), the OMP default.
  /// Local rank 0 is this process: neither, it keeps its own.
  static WorkerSettings worker_settings(int local_rank, const std::string& error_dir, bool set_omp_threads);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace lightning::fabric
