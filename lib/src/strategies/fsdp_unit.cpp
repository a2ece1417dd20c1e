#include "lightning/fabric/strategies/fsdp_unit.h"

#include <torch/nn/modules/container/sequential.h>

#include "lightning/fabric/utilities/activation_checkpoint.h"

namespace lightning::fabric {

FSDPUnitImpl::FSDPUnitImpl(torch::nn::AnyModule wrapped)
    : FSDPUnitImpl(wrapped.ptr(), [wrapped](at::Tensor input) mutable { return wrapped.forward<at::Tensor>(std::move(input)); }) {}

FSDPUnitImpl::FSDPUnitImpl(torch::nn::Sequential wrapped)
    : FSDPUnitImpl(wrapped.ptr(), [wrapped](at::Tensor input) mutable { return wrapped->forward(std::move(input)); }) {}

FSDPUnitImpl::FSDPUnitImpl(std::shared_ptr<torch::nn::Module> wrapped, std::function<at::Tensor(at::Tensor)> forward)
    : WrapperModule(std::move(wrapped)), forward_(std::move(forward)) {}

at::Tensor FSDPUnitImpl::forward(at::Tensor input) {
  const auto run = [this](const at::Tensor& x) {
    if (!is_checkpointed(*wrapped())) return forward_(x);
    return checkpoint([this](const at::Tensor& y) { return forward_(y); }, x, wrapped()->parameters());
  };
  const std::shared_ptr<Hooks> hooks = hooks_.lock();
  if (!hooks) return run(input);
  hooks->before_forward();
  return hooks->after_forward(run(input));
}

namespace {
int64_t parameter_count(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& parameter : module.parameters()) count += parameter.numel();
  return count;
}
}  // namespace

int wrap_sequential_children(torch::nn::Module& root, int64_t min_params) {
  return replace_sequential_children(root, [min_params](const torch::nn::AnyModule& child) -> std::optional<torch::nn::AnyModule> {
    if (dynamic_cast<FSDPUnitImpl*>(child.ptr().get()) != nullptr || parameter_count(*child.ptr()) < min_params) {
      return std::nullopt;
    }
    return torch::nn::AnyModule(FSDPUnit(child));
  });
}

}  // namespace lightning::fabric
