// Calling a submodule through Fabric: lf::call(block, x) is block->forward(x) plus what setup
// arranged for that block. LibTorch modules have no virtual forward and no forward hooks, so a
// strategy cannot act around a submodule that its parent calls directly; a parent that calls its
// blocks through lf::call lets it:
//   - activation checkpointing (activation_checkpoint.h): a marked module is checkpointed;
//   - fsdp units made by FSDPOptions::auto_wrap outside a Sequential: the unit's parameters are
//     gathered before the forward and given back after it.
// For a module nothing marked, lf::call is the plain forward (one lookup in a small table).
//
//   for (auto& block : blocks) x = lf::call(block, x);
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>

namespace lightning::fabric {

/// What a strategy runs around a module's forward (fsdp: gather before, give back after). The
/// strategy owns it; modules and the table below hold it weakly.
struct LF_API ForwardHooks {
  virtual ~ForwardHooks() = default;
  /// Runs before the forward; returns the input the forward gets (input itself, or e.g. cast).
  virtual at::Tensor before_forward(at::Tensor input) = 0;
  virtual at::Tensor after_forward(at::Tensor output) = 0;
};

/// For strategies, at setup: lf::call(module, ...) runs hooks around module's forward from now on
/// (held weakly: they end with the strategy). A null pointer removes them.
LF_API void set_forward_hooks(const torch::nn::Module& module, const std::shared_ptr<ForwardHooks>& hooks);
/// The hooks set for module, or null.
LF_API std::shared_ptr<ForwardHooks> forward_hooks(const torch::nn::Module& module);

namespace detail {
/// forward(input) between hooks (when not null), checkpointed inside them when module is marked
/// for activation checkpointing. Used by lf::call and by FSDPUnit.
LF_API at::Tensor call_module(torch::nn::Module& module, const std::shared_ptr<ForwardHooks>& hooks,
                              const std::function<at::Tensor(const at::Tensor&)>& forward, const at::Tensor& input);
}  // namespace detail

/// module's forward(input) with what setup arranged for it (see above). ModuleHolder: a
/// TORCH_MODULE holder (Block) or a std::shared_ptr to the Impl; its forward takes one tensor.
template <class ModuleHolder>
at::Tensor call(ModuleHolder&& module, const at::Tensor& input) {
  auto* impl = &*module;
  return detail::call_module(*impl, forward_hooks(*impl), [impl](const at::Tensor& x) { return impl->forward(x); }, input);
}

}  // namespace lightning::fabric
