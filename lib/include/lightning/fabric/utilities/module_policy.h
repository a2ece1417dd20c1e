// Which submodules of a model a setting applies to: Python's policies, a set of module classes or
// a function of the module and its name. Used by activation checkpointing (activation_checkpoint.h).
//
//   lf::ModulePolicy::of_type<BlockImpl>()                    // every BlockImpl, anywhere
//   lf::ModulePolicy([](const torch::nn::Module& m, const std::string& name) {
//     return name.rfind("encoder.", 0) == 0;                  // or any predicate
//   })
#pragma once

#include "lightning/fabric/export.h"

#include <torch/nn/module.h>

#include <functional>
#include <string>

namespace lightning::fabric {

class LF_API ModulePolicy {
 public:
  /// module: a submodule; name: its dotted path from the set-up module ("blocks.3", "block0").
  using Predicate = std::function<bool(const torch::nn::Module& module, const std::string& name)>;

  /// Matches nothing (the setting is off).
  ModulePolicy() = default;
  explicit ModulePolicy(Predicate predicate) : predicate_(std::move(predicate)) {}

  /// Matches every module whose class is one of ModuleImpl... or derives from one (the Impl
  /// class, e.g. BlockImpl for TORCH_MODULE(Block)).
  template <class... ModuleImpl>
  static ModulePolicy of_type() {
    static_assert(sizeof...(ModuleImpl) > 0, "ModulePolicy::of_type needs at least one module class");
    return ModulePolicy([](const torch::nn::Module& module, const std::string&) {
      return ((dynamic_cast<const ModuleImpl*>(&module) != nullptr) || ...);
    });
  }

  bool empty() const { return !predicate_; }
  bool matches(const torch::nn::Module& module, const std::string& name) const {
    return predicate_ && predicate_(module, name);
  }

 private:
  Predicate predicate_;
};

}  // namespace lightning::fabric
