// A [[nodiscard]] RAII guard that runs an exit action once, when it goes out of scope. Fabric's
// context managers (autocast, init_tensor, init_module, ...) return one of these.
#pragma once

#include "lightning/fabric/export.h"

#include <c10/core/ScalarType.h>

#include <functional>
#include <utility>

namespace lightning::fabric {

class [[nodiscard]] ScopeGuard {
 public:
  ScopeGuard() = default;
  explicit ScopeGuard(std::function<void()> on_exit) : on_exit_(std::move(on_exit)) {}
  ScopeGuard(ScopeGuard&& other) noexcept : on_exit_(std::exchange(other.on_exit_, nullptr)) {}
  ScopeGuard& operator=(ScopeGuard&& other) noexcept {
    if (this != &other) {
      release();
      on_exit_ = std::exchange(other.on_exit_, nullptr);
    }
    return *this;
  }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
  ~ScopeGuard() { release(); }

  /// Chains another guard: both exit, the later one first (as nested `with` blocks do).
  ScopeGuard then(ScopeGuard inner) && {
    auto outer = std::exchange(on_exit_, nullptr);
    auto inner_exit = std::exchange(inner.on_exit_, nullptr);
    return ScopeGuard([outer, inner_exit] {
      if (inner_exit) inner_exit();
      if (outer) outer();
    });
  }

 private:
  void release() {
    if (on_exit_) std::exchange(on_exit_, nullptr)();
  }
  std::function<void()> on_exit_;
};

/// Sets the default floating dtype for the guard's lifetime (torch::set_default_dtype).
LF_API ScopeGuard default_dtype_guard(c10::ScalarType dtype);

}  // namespace lightning::fabric
