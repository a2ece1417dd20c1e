#include "lightning/fabric/utilities/empty_init.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <memory>

namespace lightning::fabric {

namespace {
// Boxed kernel for `op_(Tensor(a!) self, ...) -> Tensor(a!)`: drops the arguments, returns self.
void return_self_untouched(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto count = op.schema().arguments().size();
  c10::IValue self = (*stack)[stack->size() - count];
  torch::jit::drop(*stack, count);
  stack->push_back(std::move(self));
}
}  // namespace

// Every other operator falls through the key to its usual kernels.
TORCH_LIBRARY_IMPL(_, DeferredInit, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, DeferredInit, m) {
  for (const char* name : {"uniform_", "normal_", "random_", "random_.from", "random_.to", "bernoulli_.float",
                           "bernoulli_.Tensor"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&return_self_untouched>());
  }
}

ScopeGuard empty_init_guard(bool enabled) {
  if (!enabled) return ScopeGuard();
  auto include = std::make_shared<c10::impl::IncludeDispatchKeyGuard>(c10::DispatchKey::DeferredInit);
  return ScopeGuard([include]() mutable { include.reset(); });
}

}  // namespace lightning::fabric
