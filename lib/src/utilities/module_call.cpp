#include "lightning/fabric/utilities/module_call.h"

#include "lightning/fabric/internal/module_table.h"
#include "lightning/fabric/utilities/activation_checkpoint.h"

namespace lightning::fabric {
namespace {
internal::ModuleTable<std::weak_ptr<ForwardHooks>>& hooks_table() {
  static internal::ModuleTable<std::weak_ptr<ForwardHooks>> table;
  return table;
}
}  // namespace

void set_forward_hooks(const torch::nn::Module& module, const std::shared_ptr<ForwardHooks>& hooks) {
  hooks_table().set(module, hooks ? std::optional<std::weak_ptr<ForwardHooks>>(hooks) : std::nullopt);
}

std::shared_ptr<ForwardHooks> forward_hooks(const torch::nn::Module& module) {
  const auto hooks = hooks_table().get(module);
  return hooks ? hooks->lock() : nullptr;
}

at::Tensor detail::call_module(torch::nn::Module& module, const std::shared_ptr<ForwardHooks>& hooks,
                               const std::function<at::Tensor(const at::Tensor&)>& forward, const at::Tensor& input) {
  const auto run = [&](const at::Tensor& x) {
    if (!is_checkpointed(module)) return forward(x);
    detail::count_checkpointed_call(module);
    return checkpoint(forward, x, module.parameters());
  };
  if (!hooks) return run(input);
  return hooks->after_forward(run(hooks->before_forward(input)));
}

}  // namespace lightning::fabric
