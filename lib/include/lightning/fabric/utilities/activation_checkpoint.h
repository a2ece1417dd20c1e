// Activation checkpointing: run part of a model without keeping the activations it makes, and run
// it again during backward to get them back (Python's torch.utils.checkpoint, which LibTorch's
// C++ API lacks). Memory for activations falls to the checkpointed parts' inputs; the price is one
// more forward of those parts in every backward.
//
//   x = lf::checkpoint(block, x);                         // a module's forward(x)
//   auto out = lf::checkpoint(fn, {a, b}, parameters);    // any function of tensors
//
// Or let setup choose: a ModulePolicy in SetupOptions::activation_checkpointing (any strategy),
// DDPOptions::activation_checkpointing or FSDPOptions::activation_checkpointing marks the matching
// submodules of the set-up model. A marked module is checkpointed when its forward runs through
// lf::call(module, x), or by itself where Fabric can wrap it: a child of a Sequential, or an
// FSDPUnit's module. LibTorch modules have no virtual forward and no hooks, so a module that its
// parent calls directly (block->forward(x), block(x)) cannot be intercepted: call it through
// lf::call (module_call.h), which is a plain forward for modules nothing marked.
//
// What recomputation preserves: the CPU random state and the CUDA random state of every CUDA
// device among the inputs (dropout draws the same mask), and the autocast state of the forward.
// Gradients reach the inputs and the listed parameters through the ordinary graph, so the ddp and
// fsdp gradient hooks see them as without checkpointing. Limits: the function must compute the
// same thing twice (no reads of state that changes between forward and backward, no in-place
// changes to its inputs); side effects happen twice (a BatchNorm's running statistics are updated
// twice); outputs that are not floating point get no gradient; nested use works (the inner part is
// recomputed inside the outer one's recompute).
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "lightning/fabric/utilities/module_policy.h"
#include "lightning/fabric/utilities/wrapper_module.h"

namespace lightning::fabric {

using CheckpointFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

namespace detail {
template <class T, class = void>
struct is_module_holder : std::false_type {};
template <class T>
struct is_module_holder<T, std::void_t<typename T::ContainedType>> : std::true_type {};
template <class T>
struct is_module_holder<std::shared_ptr<T>> : std::is_base_of<torch::nn::Module, T> {};
template <class F>
using if_function = std::enable_if_t<!is_module_holder<std::decay_t<F>>::value, int>;

LF_API std::vector<at::Tensor> checkpoint_tensors(const CheckpointFunction& fn, const std::vector<at::Tensor>& inputs,
                                                  const std::vector<at::Tensor>& parameters);
}  // namespace detail

/// fn(inputs) without keeping its intermediate activations; fn runs again during backward.
/// fn: any callable taking const std::vector<at::Tensor>& and returning std::vector<at::Tensor>.
/// parameters: the tensors fn reads besides its inputs whose gradients are wanted (a module's
/// parameters). The backward throws RuntimeError when fn reads a tensor that requires grad and
/// is in neither list (it would silently get no gradient). Without grad mode fn just runs.
template <class F, detail::if_function<F> = 0>
std::vector<at::Tensor> checkpoint(F&& fn, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& parameters = {}) {
  return detail::checkpoint_tensors(CheckpointFunction(std::forward<F>(fn)), inputs, parameters);
}

/// One tensor in, one tensor out: fn takes const at::Tensor& and returns at::Tensor.
template <class F, detail::if_function<F> = 0>
at::Tensor checkpoint(F&& fn, const at::Tensor& input, const std::vector<at::Tensor>& parameters = {}) {
  std::function<at::Tensor(const at::Tensor&)> one(std::forward<F>(fn));
  return detail::checkpoint_tensors([one](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{one(x[0])}; },
                                    {input}, parameters)[0];
}

namespace detail {
/// Shared ownership of the module a holder refers to: a TORCH_MODULE holder or a std::shared_ptr.
template <class Impl>
std::shared_ptr<Impl> shared_module(const std::shared_ptr<Impl>& module) {
  return module;
}
template <class Impl>
std::shared_ptr<Impl> shared_module(const torch::nn::ModuleHolder<Impl>& module) {
  return module.ptr();
}
}  // namespace detail

/// A module's forward(input), with the module's parameters listed. ModuleHolder: a TORCH_MODULE
/// holder (Block) or a std::shared_ptr to the Impl. The graph keeps the module alive until the
/// backward has run it again.
template <class ModuleHolder, std::enable_if_t<detail::is_module_holder<std::decay_t<ModuleHolder>>::value, int> = 0>
at::Tensor checkpoint(ModuleHolder&& module, const at::Tensor& input) {
  auto shared = detail::shared_module(module);
  return checkpoint([shared](const at::Tensor& x) { return shared->forward(x); }, input, shared->parameters());
}

/// Marks every submodule of root that policy matches (root itself excluded) for checkpointing:
/// children of a Sequential are wrapped in place (a Checkpointed module, transparent to names and
/// checkpoints), an FSDPUnit's module is checkpointed inside the unit, and every other match is
/// checkpointed when called through lf::call. Returns how many modules it marked. Fabric::setup
/// calls it with the setup's or the strategy's policy.
LF_API int apply_activation_checkpointing(torch::nn::Module& root, const ModulePolicy& policy);

/// Whether apply_activation_checkpointing marked module (lf::call, module_call.h, then checkpoints it).
LF_API bool is_checkpointed(const torch::nn::Module& module);

namespace detail {
/// Counts a checkpointed call of a marked module (lf::call and the Sequential wrapper do).
LF_API void count_checkpointed_call(const torch::nn::Module& module);
/// The checkpointed calls of module since it was marked (0 when unmarked): Fabric::backward
/// refuses a marked module that ran without one (its policy checkpointed nothing).
LF_API uint64_t checkpointed_calls(const torch::nn::Module& module);
}  // namespace detail

/// The wrapper apply_activation_checkpointing puts around a Sequential's child: its forward is
/// the child's, checkpointed. Its parameters, buffers and children carry the child's names.
class LF_API CheckpointedImpl : public WrapperModule {
 public:
  explicit CheckpointedImpl(torch::nn::AnyModule wrapped);
  at::Tensor forward(at::Tensor input);

 private:
  torch::nn::AnyModule forward_;
};
TORCH_MODULE(Checkpointed);

}  // namespace lightning::fabric
