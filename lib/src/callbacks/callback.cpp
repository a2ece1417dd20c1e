#include "lightning/fabric/callbacks/callback.h"

#include <type_traits>
#include <unordered_map>
#include <vector>

namespace lightning::fabric {

namespace {
// Integral and floating values are normalised so that get<int64_t> / get<double> find them
// whatever literal type the caller wrote.
std::any normalised(std::any value) {
  if (auto* v = std::any_cast<int>(&value)) return static_cast<int64_t>(*v);
  if (auto* v = std::any_cast<long>(&value)) return static_cast<int64_t>(*v);
  if (auto* v = std::any_cast<long long>(&value)) return static_cast<int64_t>(*v);
  if (auto* v = std::any_cast<unsigned>(&value)) return static_cast<int64_t>(*v);
  if (auto* v = std::any_cast<size_t>(&value)) return static_cast<int64_t>(*v);
  if (auto* v = std::any_cast<float>(&value)) return static_cast<double>(*v);
  if (auto* v = std::any_cast<const char*>(&value)) return std::string(*v);
  return value;
}

using Hook = void (Callback::*)(const HookArgs&);
const std::vector<std::pair<std::string, Hook>>& hooks() {
  static const std::vector<std::pair<std::string, Hook>> table = {
      {"on_train_epoch_start", &Callback::on_train_epoch_start},
      {"on_train_epoch_end", &Callback::on_train_epoch_end},
      {"on_train_batch_start", &Callback::on_train_batch_start},
      {"on_train_batch_end", &Callback::on_train_batch_end},
      {"on_before_backward", &Callback::on_before_backward},
      {"on_after_backward", &Callback::on_after_backward},
      {"on_before_optimizer_step", &Callback::on_before_optimizer_step},
      {"on_before_zero_grad", &Callback::on_before_zero_grad},
      {"on_validation_epoch_start", &Callback::on_validation_epoch_start},
      {"on_validation_epoch_end", &Callback::on_validation_epoch_end},
      {"on_validation_batch_start", &Callback::on_validation_batch_start},
      {"on_validation_batch_end", &Callback::on_validation_batch_end},
  };
  return table;
}

// The hooks Fabric calls itself.
const std::vector<std::pair<std::string, Hook>>& fabric_hooks() {
  static const std::vector<std::pair<std::string, Hook>> table = {
      {"on_after_setup", &Callback::on_after_setup},
      {"on_after_optimizer_step", &Callback::on_after_optimizer_step},
  };
  return table;
}
}  // namespace

HookArgs::HookArgs(std::initializer_list<std::pair<const std::string, std::any>> values) {
  for (const auto& [name, value] : values) set(name, value);
}

void HookArgs::set(const std::string& name, std::any value) { values_[name] = normalised(std::move(value)); }

std::string HookArgs::names() const {
  std::string joined;
  for (const auto& [name, value] : values_) joined += (joined.empty() ? "" : ", ") + name;
  return joined.empty() ? "(none)" : joined;
}

void invoke_hook(Callback& callback, const std::string& name, const HookArgs& args) {
  static const std::unordered_map<std::string, Hook> by_name = [] {
    std::unordered_map<std::string, Hook> all(hooks().begin(), hooks().end());
    all.insert(fabric_hooks().begin(), fabric_hooks().end());
    return all;
  }();
  auto found = by_name.find(name);
  if (found != by_name.end()) {
    (callback.*(found->second))(args);
  } else {
    callback.on_hook(name, args);
  }
}

const std::vector<std::string>& trainer_hook_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const auto& [name, hook] : hooks()) all.push_back(name);
    return all;
  }();
  return names;
}

}  // namespace lightning::fabric
