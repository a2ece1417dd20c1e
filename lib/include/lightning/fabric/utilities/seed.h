// Seeding every random number generator the runtime and LibTorch use, as Python's
// seed_everything: the seed is recorded in PL_GLOBAL_SEED so that worker processes and the
// distributed sampler derive the same streams.
#pragma once

#include "lightning/fabric/export.h"

#include <cstdint>
#include <optional>

namespace lightning::fabric {

/// Seeds torch (CPU and CUDA) and the C library, exports PL_GLOBAL_SEED (and PL_SEED_WORKERS when
/// workers is true). Without a seed, PL_GLOBAL_SEED is reused if set, else 0 with a warning.
/// Returns the seed used. Throws ValueError, before seeding anything, for a seed (given or from
/// PL_GLOBAL_SEED) above 4294967295 = 2**32 - 1 (Python's bounds: numpy's uint32 seeds), or if
/// PL_GLOBAL_SEED is not a whole number >= 0.
LF_API uint64_t seed_everything(std::optional<uint64_t> seed = std::nullopt, bool workers = false);

/// The seed recorded by seed_everything (PL_GLOBAL_SEED), or 0 when unset; ValueError when malformed.
LF_API uint64_t global_seed();

}  // namespace lightning::fabric
