#include "lightning/fabric/strategies/fsdp_unit.h"

#include <torch/nn/modules/container/sequential.h>

namespace lightning::fabric {

FSDPUnitImpl::FSDPUnitImpl(torch::nn::AnyModule wrapped)
    : FSDPUnitImpl(wrapped.ptr(), [wrapped](at::Tensor input) mutable { return wrapped.forward<at::Tensor>(std::move(input)); }) {}

FSDPUnitImpl::FSDPUnitImpl(torch::nn::Sequential wrapped)
    : FSDPUnitImpl(wrapped.ptr(), [wrapped](at::Tensor input) mutable { return wrapped->forward(std::move(input)); }) {}

FSDPUnitImpl::FSDPUnitImpl(std::shared_ptr<torch::nn::Module> wrapped, std::function<at::Tensor(at::Tensor)> forward)
    : wrapped_(std::move(wrapped)), forward_(std::move(forward)) {
  // The wrapped module's own names, one level up: checkpoints do not see the wrapper.
  for (const auto& item : wrapped_->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : wrapped_->named_buffers(/*recurse=*/false)) register_buffer(item.key(), item.value());
  for (const auto& item : wrapped_->named_children()) register_module(item.key(), item.value());
}

at::Tensor FSDPUnitImpl::forward(at::Tensor input) {
  const std::shared_ptr<Hooks> hooks = hooks_.lock();
  if (!hooks) return forward_(std::move(input));
  hooks->before_forward();
  return hooks->after_forward(forward_(std::move(input)));
}

void FSDPUnitImpl::train(bool on) {
  torch::nn::Module::train(on);
  wrapped_->train(on);  // not a registered child: its own flag is set here
}

namespace {
int64_t parameter_count(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& parameter : module.parameters()) count += parameter.numel();
  return count;
}
}  // namespace

int wrap_sequential_children(torch::nn::Module& root, int64_t min_params) {
  int wrapped = 0;
  for (const auto& module : root.modules(/*include_self=*/true)) {
    auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(module.get());
    if (sequential == nullptr) continue;
    bool changes = false;
    for (size_t i = 0; i < sequential->size(); ++i) {
      const auto child = sequential->ptr(i);
      changes |= dynamic_cast<FSDPUnitImpl*>(child.get()) == nullptr && parameter_count(*child) >= min_params;
    }
    if (!changes) continue;
    torch::nn::SequentialImpl rebuilt;
    const auto names = sequential->named_children();
    size_t index = 0;
    for (const auto& child : *sequential) {
      const std::string name = names[index++].key();
      const bool wrap = dynamic_cast<FSDPUnitImpl*>(child.ptr().get()) == nullptr && parameter_count(*child.ptr()) >= min_params;
      if (wrap) {
        rebuilt.push_back(std::string(name), torch::nn::AnyModule(FSDPUnit(child)));
        ++wrapped;
      } else {
        rebuilt.push_back(std::string(name), torch::nn::AnyModule(child));
      }
    }
    *sequential = std::move(rebuilt);  // in place: the model's own Sequential member sees the units
  }
  return wrapped;
}

}  // namespace lightning::fabric
