#include "lightning/fabric/strategies/fsdp_unit.h"

#include <torch/nn/modules/container/sequential.h>

#include <set>

#include "lightning/fabric/utilities/activation_checkpoint.h"
#include "lightning/fabric/utilities/module_call.h"

namespace lightning::fabric {

FSDPUnitImpl::FSDPUnitImpl(torch::nn::AnyModule wrapped)
    : FSDPUnitImpl(wrapped.ptr(), [wrapped](at::Tensor input) mutable { return wrapped.forward<at::Tensor>(std::move(input)); }) {}

FSDPUnitImpl::FSDPUnitImpl(torch::nn::Sequential wrapped)
    : FSDPUnitImpl(wrapped.ptr(), [wrapped](at::Tensor input) mutable { return wrapped->forward(std::move(input)); }) {}

FSDPUnitImpl::FSDPUnitImpl(std::shared_ptr<torch::nn::Module> wrapped, std::function<at::Tensor(at::Tensor)> forward)
    : WrapperModule(std::move(wrapped)), forward_(std::move(forward)) {}

at::Tensor FSDPUnitImpl::forward(at::Tensor input) {
  return detail::call_module(*wrapped(), hooks_.lock(), [this](const at::Tensor& x) { return forward_(x); }, input);
}

namespace {
int64_t parameter_count(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& parameter : module.parameters()) count += parameter.numel();
  return count;
}
}  // namespace

int wrap_sequential_children(torch::nn::Module& root, int64_t min_params) {
  return replace_sequential_children(root, [min_params](const torch::nn::AnyModule& child,
                                                        const std::string&) -> std::optional<torch::nn::AnyModule> {
    if (dynamic_cast<FSDPUnitImpl*>(child.ptr().get()) != nullptr || parameter_count(*child.ptr()) < min_params) {
      return std::nullopt;
    }
    return torch::nn::AnyModule(FSDPUnit(child));
  });
}

std::vector<std::shared_ptr<torch::nn::Module>> wrap_matching_modules(torch::nn::Module& root, const ModulePolicy& policy) {
  if (policy.empty()) return {};
  replace_sequential_children(root, [&policy](const torch::nn::AnyModule& child,
                                              const std::string& name) -> std::optional<torch::nn::AnyModule> {
    if (dynamic_cast<FSDPUnitImpl*>(child.ptr().get()) != nullptr || !policy.matches(unwrapped(*child.ptr()), name)) {
      return std::nullopt;
    }
    return torch::nn::AnyModule(FSDPUnit(child));
  });
  std::vector<std::shared_ptr<torch::nn::Module>> called;
  std::set<const torch::nn::Module*> in_sequential;  // their calls pass through the Sequential's units
  for (const auto& module : root.modules(/*include_self=*/true)) {
    if (auto* sequential = sequential_at(*module)) {
      for (const auto& child : sequential->children()) in_sequential.insert(child.get());
    }
  }
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    const auto& module = item.value();
    if (in_sequential.count(module.get()) != 0 || dynamic_cast<WrapperModule*>(module.get()) != nullptr) continue;
    if (policy.matches(*module, item.key())) called.push_back(module);
  }
  return called;
}

}  // namespace lightning::fabric
