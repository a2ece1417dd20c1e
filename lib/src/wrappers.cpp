#include "lightning/fabric/wrappers.h"

#include <torch/types.h>

#include <atomic>
#include <set>

namespace lightning::fabric {
namespace detail {
namespace {
std::atomic<int>& backward_depth() {
  static std::atomic<int> depth{0};
  return depth;
}
}  // namespace

BackwardScope::BackwardScope() { ++backward_depth(); }
BackwardScope::~BackwardScope() { --backward_depth(); }
bool BackwardScope::active() { return backward_depth().load() > 0; }

void check_backward_through_fabric() {
  if (BackwardScope::active()) return;
  throw RuntimeError(
      "loss.backward() was called on a value computed by a FabricModule. Call fabric.backward(loss) instead: "
      "it runs backward through the strategy and precision plugin (gradient synchronisation, loss scaling), "
      "so the same loop stays correct on every device and strategy.");
}

torch::OrderedDict<std::string, at::Tensor> module_state_dict(const torch::nn::Module& module) {
  torch::OrderedDict<std::string, at::Tensor> state;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) state.insert(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true)) state.insert(item.key(), item.value());
  return state;
}

void load_module_state_dict(torch::nn::Module& module, const torch::OrderedDict<std::string, at::Tensor>& state,
                            bool strict) {
  auto own = module_state_dict(module);
  std::vector<std::string> missing, unexpected;
  for (const auto& item : own) {
    if (!state.contains(item.key())) missing.push_back(item.key());
  }
  for (const auto& item : state) {
    if (!own.contains(item.key())) unexpected.push_back(item.key());
  }
  if (strict && (!missing.empty() || !unexpected.empty())) {
    throw RuntimeError("load_state_dict(strict=true): the state does not match the module. Missing keys: [" +
                       join_names(missing) + "]; unexpected keys: [" + join_names(unexpected) +
                       "]. Pass strict=false to load the keys that match.");
  }
  torch::NoGradGuard no_grad;
  for (auto& item : own) {
    const at::Tensor* source = state.find(item.key());
    if (source == nullptr) continue;
    LF_CHECK(source->sizes() == item.value().sizes(), RuntimeError, "load_state_dict: '", item.key(),
             "' has shape ", source->sizes(), " in the state but ", item.value().sizes(), " in the module.");
    item.value().copy_(*source);
  }
}
}  // namespace detail

void FabricOptimizer::zero_grad(bool set_to_none) {
  for (auto& group : optimizer_->param_groups()) {
    for (auto& parameter : group.params()) {
      if (!parameter.grad().defined()) continue;
      if (set_to_none) {
        parameter.mutable_grad().reset();
      } else {
        torch::NoGradGuard no_grad;
        parameter.mutable_grad().zero_();
      }
    }
  }
}

}  // namespace lightning::fabric
