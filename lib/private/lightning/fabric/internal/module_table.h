// A process-wide table from modules to values, for what setup attaches to a module that LibTorch
// gives no slot for (activation checkpointing's marks, lf::call's forward hooks). Entries end with
// their module: a weak pointer tells a live module from a new one at a freed module's address.
// Thread-safe; every call takes one lock.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace lightning::fabric::internal {

template <class Value>
class ModuleTable {
 public:
  /// module's value from now on; nullopt removes it. Drops the entries of modules that ended.
  void set(const torch::nn::Module& module, std::optional<Value> value) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end();) it = it->second.first.expired() ? entries_.erase(it) : std::next(it);
    if (value) {
      entries_[&module] = {module.shared_from_this(), std::move(*value)};
    } else {
      entries_.erase(&module);
    }
  }
  /// module's value, or nullopt.
  std::optional<Value> get(const torch::nn::Module& module) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = entries_.find(&module);
    if (found == entries_.end()) return std::nullopt;
    const auto alive = found->second.first.lock();
    if (!alive || alive.get() != &module) return std::nullopt;
    return found->second.second;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<const torch::nn::Module*, std::pair<std::weak_ptr<const torch::nn::Module>, Value>> entries_;
};

}  // namespace lightning::fabric::internal
