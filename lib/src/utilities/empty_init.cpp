#include "lightning/fabric/utilities/empty_init.h"

#include "lightning/fabric/utilities/init_mode.h"

namespace lightning::fabric {

ScopeGuard empty_init_guard(bool enabled) {
  if (!enabled) return ScopeGuard();
  return internal::init_mode_guard(internal::InitMode::SkipRandomFills);
}

}  // namespace lightning::fabric
