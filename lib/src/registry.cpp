#include "lightning/fabric/registry.h"

namespace lightning::fabric {

std::string join_names(const std::vector<std::string>& names, const std::string& separator) {
  std::string result;
  for (const auto& name : names) {
    if (!result.empty()) result += separator;
    result += name;
  }
  return result;
}

}  // namespace lightning::fabric
