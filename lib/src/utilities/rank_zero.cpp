#include "lightning/fabric/utilities/rank_zero.h"

#include <iostream>
#include <string>

#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric {
namespace {
// The first of the launchers' rank variables that is set. Never throws, as warnings may be printed
// anywhere: a malformed or out-of-range value counts as rank 0 (the cluster environment reports it
// when the Fabric reads its rank, and set_rank_zero_only_rank then corrects this one).
int rank_from_env() {
  const env::Reader reader;
  for (const char* name : {env::kRank, "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"}) {
    if (!reader.text(name)) continue;
    try {
      return *reader.int_value(name);
    } catch (const std::exception&) {
      return 0;
    }
  }
  return 0;
}
int& current_rank() {
  static int rank = rank_from_env();
  return rank;
}
}  // namespace

int rank_zero_only_rank() { return current_rank(); }
void set_rank_zero_only_rank(int rank) { current_rank() = rank; }

void rank_zero_warn(const std::string& message) {
  if (current_rank() == 0) std::cerr << "[lightning-fabric] warning: " << message << std::endl;
}

void rank_zero_info(const std::string& message) {
  if (current_rank() == 0) std::cerr << "[lightning-fabric] " << message << std::endl;
}

}  // namespace lightning::fabric
