// What Fabric resolved its options to (fabric.config()): canonical names and numbers after the
// environment's overrides and Python Fabric's rules (accelerator "auto", the devices table,
// precision aliases, strategy "auto" and its fallbacks), plus the warnings resolution produced.
#pragma once

#include "lightning/fabric/export.h"

#include <string>
#include <vector>

namespace lightning::fabric {

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

}  // namespace lightning::fabric
