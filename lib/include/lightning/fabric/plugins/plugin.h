// Common base of everything that can be passed through FabricOptions::plugins(): precision
// plugins and cluster environments (no checkpoint-IO plugin exists). The Connector sorts the
// plugins by their concrete base class.
#pragma once

#include "lightning/fabric/export.h"

#include <string>

namespace lightning::fabric {

class LF_API Plugin {
 public:
  virtual ~Plugin() = default;
  /// Short name used in messages ("32-true", "lightning", ...).
  virtual std::string name() const = 0;
};

}  // namespace lightning::fabric
