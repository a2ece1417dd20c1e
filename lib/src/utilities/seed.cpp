#include "lightning/fabric/utilities/seed.h"

#include <torch/cuda.h>
#include <torch/utils.h>

#include <cstdlib>
#include <string>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/utilities/env_vars.h"
#include "lightning/fabric/utilities/rank_zero.h"

namespace lightning::fabric {

namespace {
// Python's bounds (numpy's uint32 seeds): a seed means the same run in both.
constexpr uint64_t kMinSeed = 0;
constexpr uint64_t kMaxSeed = 4294967295ULL;  // 2**32 - 1
}  // namespace

uint64_t seed_everything(std::optional<uint64_t> seed, bool workers) {
  const bool from_env = !seed;
  if (!seed) {
    seed = env::Reader().unsigned_integer(env::kGlobalSeed);
    if (!seed) {
      seed = 0;
      rank_zero_warn("seed_everything() was called without a seed and PL_GLOBAL_SEED is unset: using seed 0.");
    }
  }
  LF_CHECK(*seed <= kMaxSeed, ValueError, "seed_everything: ", *seed, " is not in bounds, numpy accepts from ",
           kMinSeed, " to ", kMaxSeed, from_env ? " (read from PL_GLOBAL_SEED)" : "",
           ". Pass a seed in that range (Python Lightning's bounds, so that a seed means the same in both)",
           from_env ? ", or set PL_GLOBAL_SEED to one." : ".");
  torch::manual_seed(*seed);
  if (torch::cuda::is_available()) torch::cuda::manual_seed_all(*seed);
  std::srand(static_cast<unsigned>(*seed));
  setenv(env::kGlobalSeed, std::to_string(*seed).c_str(), 1);
  setenv(env::kSeedWorkers, workers ? "1" : "0", 1);
  return *seed;
}

uint64_t global_seed() { return env::Reader().unsigned_integer(env::kGlobalSeed).value_or(0); }

}  // namespace lightning::fabric
