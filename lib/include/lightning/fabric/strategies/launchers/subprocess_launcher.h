// Fabric::launch() without a launcher: re-executes the current program once per extra local
// rank with the environment contract lightning-run would give it, supervises the
// children with the launcher's process code, and lets this process continue as local rank 0.
// When a child fails, the others and this process are stopped and the job exits with the child's
// code (or 128 + signal); when this process exits normally it first waits for its children.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <string>

#include "lightning/fabric/utilities/env_vars.h"

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

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace lightning::fabric
