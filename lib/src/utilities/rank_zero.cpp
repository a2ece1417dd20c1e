#include "lightning/fabric/utilities/rank_zero.h"

#include <cstdlib>
#include <iostream>
#include <string>

namespace lightning::fabric {
namespace {
int rank_from_env() {
  for (const char* name : {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"}) {
    if (const char* value = std::getenv(name)) {
      try {
        return std::stoi(value);
      } catch (const std::exception&) {
        return 0;
      }
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
