// The thread's module-initialisation mode, read by the kernel this library registers for the
// DeferredInit dispatch key (meta_init.cpp). empty_init_guard and meta_init_guard set it.
#pragma once

#include "lightning/fabric/utilities/scope_guard.h"

namespace lightning::fabric::internal {

enum class InitMode {
  Normal,           // the key is not included: operators run as usual
  SkipRandomFills,  // empty_init_guard: in-place random fills return their tensor untouched
  Meta,             // meta_init_guard: tensors are made on the meta device, operations recorded
};

/// Includes the DeferredInit key and sets mode on this thread until the guard ends, then restores
/// the previous mode. A Meta guard inside another keeps the outer record.
ScopeGuard init_mode_guard(InitMode mode);

}  // namespace lightning::fabric::internal
