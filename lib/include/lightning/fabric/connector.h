// The Connector turns FabricOptions plus the LT_* environment into concrete choices, with the
// rules of Python's _Connector: environment overrides and the CLI conflict
// error, accelerator "auto"/"gpu", the devices table, precision strings and aliases, strategy
// "auto" and its fallbacks. resolve() is pure (names only); build() instantiates the plugins.
#pragma once

#include "lightning/fabric/export.h"

#include <memory>
#include <string>
#include <vector>

#include "lightning/fabric/accelerators/accelerator.h"
#include "lightning/fabric/options.h"
#include "lightning/fabric/plugins/environments/cluster_environment.h"
#include "lightning/fabric/plugins/precision/precision.h"
#include "lightning/fabric/strategies/strategy.h"
#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric {

/// The outcome of resolution: canonical names and numbers, plus the warnings it produced.
struct LF_API ResolvedConfig {
  std::string accelerator;          // "cpu" | "cuda" | a user-registered name
  std::string strategy;             // "single_device" | "ddp" | ... (a strategy_choices() name)
  std::vector<int> device_indices;  // one per local process (cpu: 0..n-1)
  int num_nodes = 1;
  std::string precision;            // canonical: "32-true", "bf16-mixed", ...
  int launched_world_size = 1;      // processes an external launcher started in all (1: none)
  std::vector<std::string> warnings;

  int num_processes_per_node() const { return static_cast<int>(device_indices.size()); }
  int world_size() const { return num_processes_per_node() * num_nodes; }
};

/// Resolves the options under an environment. Throws ValueError/TypeError/RuntimeError on any
/// invalid value or conflict, naming it and listing the valid choices.
LF_API ResolvedConfig resolve_config(const FabricOptions& options, const env::EnvLookup& env);

/// Instantiated choices. Owned by Fabric.
struct LF_API Connector {
  ResolvedConfig config;
  std::shared_ptr<Accelerator> accelerator;
  std::shared_ptr<ClusterEnvironment> cluster_environment;
  std::shared_ptr<Precision> precision;
  std::shared_ptr<Strategy> strategy;

  /// Resolves, then builds each part through its registry; plugins given in the options replace
  /// the built-in precision / cluster environment. Warnings go to the log once.
  static Connector build(const FabricOptions& options, const env::EnvLookup& env = env::process_env());
};

}  // namespace lightning::fabric
