// Messages that should appear once per job, not once per process.
#pragma once

#include <string>

namespace lightning::fabric {

/// The process's global rank as the environment tells it (RANK, then 0). Set by Fabric once
/// the strategy knows better.
int rank_zero_only_rank();
void set_rank_zero_only_rank(int rank);

/// Logs a warning on global rank 0 only (to stderr, prefixed "[lightning-fabric] warning: ").
void rank_zero_warn(const std::string& message);
/// Logs an informational line on global rank 0 only.
void rank_zero_info(const std::string& message);

}  // namespace lightning::fabric
