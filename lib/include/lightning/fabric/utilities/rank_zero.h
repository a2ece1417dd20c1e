// Messages that should appear once per job, not once per process.
#pragma once

#include "lightning/fabric/export.h"

#include <string>

namespace lightning::fabric {

/// The process's global rank as the environment tells it (RANK, then 0). Set by Fabric once
/// the strategy knows better.
LF_API int rank_zero_only_rank();
LF_API void set_rank_zero_only_rank(int rank);

/// Logs a warning on global rank 0 only (to stderr, prefixed "[lightning-fabric] warning: ").
LF_API void rank_zero_warn(const std::string& message);
/// Logs an informational line on global rank 0 only.
LF_API void rank_zero_info(const std::string& message);

}  // namespace lightning::fabric
