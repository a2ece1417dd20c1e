// Skipping random parameter initialisation while a large module is built (Fabric::init_module
// with empty_init=true), because its weights will be overwritten by a checkpoint anyway.
#pragma once

#include "lightning/fabric/export.h"

#include "lightning/fabric/utilities/scope_guard.h"

namespace lightning::fabric {

/// While the guard lives (on this thread), the in-place random fills that torch::nn::init and the
/// layers' reset() use (uniform_, normal_, random_, bernoulli_, hence also torch::rand/randn)
/// return their tensor untouched: memory stays uninitialised and the random generator does not
/// advance. Constant fills (zeros, ones, fill_) still run, so buffers such as a BatchNorm's running
/// variance keep their defined values. Works through the dispatcher key reserved for deferred
/// module initialisation (DeferredInit); enabled=false returns an inactive guard.
LF_API ScopeGuard empty_init_guard(bool enabled = true);

}  // namespace lightning::fabric
