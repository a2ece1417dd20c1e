// Callbacks: user objects whose hooks Fabric::call(name, args) invokes, in the order the callbacks
// were given to FabricOptions. The trainer's hooks are virtual methods that do
// nothing by default, so a callback overrides only those it needs and is skipped for the rest;
// any other hook name (your own) reaches on_hook. C++ cannot look at a function's parameters as
// Python does, so every hook receives the call's named arguments and takes what it needs:
//   struct PrintLoss : lf::Callback {
//     void on_train_batch_end(const lf::HookArgs& args) override {
//       std::cout << args.get<double>("loss") << "\n";
//     }
//   };
//   fabric.call("on_train_batch_end", {{"loss", loss.item<double>()}, {"batch_idx", i}});
#pragma once

#include "lightning/fabric/export.h"

#include <any>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

/// Named arguments of a hook call: any copyable values (pass pointers for large or non-copyable
/// objects, e.g. {"model", &model}). Integral values are stored as int64_t, floating ones as double.
class LF_API HookArgs {
 public:
  HookArgs() = default;
  HookArgs(std::initializer_list<std::pair<const std::string, std::any>> values);

  /// The value named name as T; TypeError naming the argument when missing or of another type.
  template <class T>
  const T& get(const std::string& name) const {
    const T* value = find<T>(name);
    LF_CHECK(value != nullptr, TypeError, "Hook argument '", name, "' ",
             values_.count(name) ? "has another type than the one asked for" : "was not passed to fabric.call",
             ". Passed: ", names(), ".");
    return *value;
  }
  /// The value named name as T, or null when missing or of another type.
  template <class T>
  const T* find(const std::string& name) const {
    auto found = values_.find(name);
    return found == values_.end() ? nullptr : std::any_cast<T>(&found->second);
  }
  bool contains(const std::string& name) const { return values_.count(name) != 0; }
  void set(const std::string& name, std::any value);
  /// The argument names, comma-separated (for messages).
  std::string names() const;

 private:
  std::map<std::string, std::any> values_;
};

class LF_API Callback {
 public:
  virtual ~Callback() = default;

  // The trainer's hooks (examples/build_your_own_trainer calls them through fabric.call).
  virtual void on_train_epoch_start(const HookArgs&) {}
  virtual void on_train_epoch_end(const HookArgs&) {}
  virtual void on_train_batch_start(const HookArgs&) {}
  virtual void on_train_batch_end(const HookArgs&) {}
  virtual void on_before_backward(const HookArgs&) {}
  virtual void on_after_backward(const HookArgs&) {}
  virtual void on_before_optimizer_step(const HookArgs&) {}
  virtual void on_before_zero_grad(const HookArgs&) {}
  virtual void on_validation_epoch_start(const HookArgs&) {}
  virtual void on_validation_epoch_end(const HookArgs&) {}
  virtual void on_validation_batch_start(const HookArgs&) {}
  virtual void on_validation_batch_end(const HookArgs&) {}

  // Hooks Fabric itself calls, where Python Fabric calls them.
  /// At the end of Fabric::setup(module, ...): {"fabric": Fabric*, "module":
  /// std::shared_ptr<torch::nn::Module>} (the original module; Python passes the wrapped one).
  virtual void on_after_setup(const HookArgs&) {}
  /// After every FabricOptimizer::step (also one the loss scaler skipped, and each CapturedStep
  /// replay): {"strategy": Strategy*, "optimizer": torch::optim::Optimizer*}. The optimizer holds
  /// what it steps: under fsdp, this rank's shards. EMA and gradient-statistics callbacks use it.
  virtual void on_after_optimizer_step(const HookArgs&) {}

  /// Every other hook name (user-defined hooks) arrives here; the default ignores it.
  virtual void on_hook(const std::string& name, const HookArgs& args) { (void)name, (void)args; }
};

/// Calls hook `name` on callback: the matching virtual method for the trainer's hooks, else
/// on_hook. Not collective.
LF_API void invoke_hook(Callback& callback, const std::string& name, const HookArgs& args);

/// The trainer's hook names, in the order Python Lightning's trainer example calls them.
LF_API const std::vector<std::string>& trainer_hook_names();

}  // namespace lightning::fabric
