#include "lightning/fabric/utilities/seed.h"

#include <torch/cuda.h>
#include <torch/utils.h>

#include <cstdlib>
#include <string>

#include "lightning/fabric/utilities/env_vars.h"
#include "lightning/fabric/utilities/rank_zero.h"

namespace lightning::fabric {

uint64_t seed_everything(std::optional<uint64_t> seed, bool workers) {
  if (!seed) {
    seed = env::Reader().unsigned_integer(env::kGlobalSeed);
    if (!seed) {
      seed = 0;
      rank_zero_warn("seed_everything() was called without a seed and PL_GLOBAL_SEED is unset: using seed 0.");
    }
  }
  torch::manual_seed(*seed);
  if (torch::cuda::is_available()) torch::cuda::manual_seed_all(*seed);
  std::srand(static_cast<unsigned>(*seed));
  setenv(env::kGlobalSeed, std::to_string(*seed).c_str(), 1);
  setenv(env::kSeedWorkers, workers ? "1" : "0", 1);
  return *seed;
}

uint64_t global_seed() { return env::Reader().unsigned_integer(env::kGlobalSeed).value_or(0); }

}  // namespace lightning::fabric
