// The Connector turns FabricOptions plus the LT_* environment into concrete choices, with the
// rules of Python's _Connector: environment overrides and the CLI conflict
// error, accelerator "auto"/"gpu", the devices table, precision strings and aliases, strategy
// "auto" and its fallbacks. resolve_config() is pure (names only); build() instantiates the plugins.
// Private to the library: Fabric owns one (behind a pointer, so this header is not installed);
// users see its outcome as fabric.config() (resolved_config.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lightning/fabric/accelerators/accelerator.h"
#include "lightning/fabric/options.h"
#include "lightning/fabric/resolved_config.h"
#include "lightning/fabric/plugins/environments/cluster_environment.h"
#include "lightning/fabric/plugins/precision/precision.h"
#include "lightning/fabric/strategies/strategy.h"
#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric {

/// Resolves the options under an environment. Throws ValueError/TypeError/RuntimeError on any
/// invalid value or conflict, naming it and listing the valid choices.
ResolvedConfig resolve_config(const FabricOptions& options, const env::EnvLookup& env);

/// Instantiated choices. Owned by Fabric.
struct Connector {
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
