// FSDPUnit: marks a submodule as its own fsdp sharding unit (Python's nested
// FullyShardedDataParallel wrapping), so that under FULL_SHARD the full parameters of only one
// unit exist at a time: gathered when its forward starts, given back when it ends, gathered again
// when the backward reaches it, and given back once its gradients are reduce-scattered.
//
//   layers->push_back(lf::FSDPUnit(Block(...)));          // in the model's constructor
//   FSDPOptions().auto_wrap_min_params = 1'000'000;       // or: wrap every Sequential child that
//                                                         // holds at least that many parameters
//
// Or by layer type, anywhere in the tree: FSDPOptions::auto_wrap = lf::ModulePolicy::of_type<BlockImpl>(),
// with the blocks that are not children of a Sequential called through lf::call (module_call.h).
//
// The wrapped module's forward must take and return one tensor. The wrapper is transparent
// everywhere else: its parameters, buffers and children carry the wrapped module's names (a
// checkpoint saved with units loads without them and back), and outside fsdp it only forwards.
#pragma once

#include "lightning/fabric/export.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <vector>

#include "lightning/fabric/utilities/module_call.h"
#include "lightning/fabric/utilities/module_policy.h"
#include "lightning/fabric/utilities/wrapper_module.h"

namespace lightning::fabric {

class LF_API FSDPUnitImpl : public WrapperModule {
 public:
  /// What the fsdp strategy does around the forward; attached by FSDPStrategy::setup_module.
  using Hooks = ForwardHooks;

  explicit FSDPUnitImpl(torch::nn::AnyModule wrapped);
  /// A Sequential (which AnyModule cannot hold: its forward is a template).
  explicit FSDPUnitImpl(torch::nn::Sequential wrapped);
  template <typename ModuleType>
  explicit FSDPUnitImpl(ModuleType wrapped) : FSDPUnitImpl(torch::nn::AnyModule(std::move(wrapped))) {}

  /// The wrapped module's forward between the strategy's hooks; checkpointed inside them when
  /// activation checkpointing marked the wrapped module (activation_checkpoint.h).
  at::Tensor forward(at::Tensor input);
  void attach(std::shared_ptr<Hooks> hooks) { hooks_ = std::move(hooks); }

 private:
  FSDPUnitImpl(std::shared_ptr<torch::nn::Module> wrapped, std::function<at::Tensor(at::Tensor)> forward);

  std::function<at::Tensor(at::Tensor)> forward_;
  std::weak_ptr<Hooks> hooks_;  // owned by the strategy
};
TORCH_MODULE(FSDPUnit);

/// Replaces every child of every Sequential inside root that holds at least min_params
/// parameters (and is not a unit already) by an FSDPUnit around it; returns how many it wrapped.
LF_API int wrap_sequential_children(torch::nn::Module& root, int64_t min_params);

/// Makes every submodule of root that policy matches (root excluded) a sharding unit
/// (FSDPOptions::auto_wrap): a child of a Sequential is wrapped in an FSDPUnit in place; every
/// other match is returned, for the strategy to make a unit whose hooks run through lf::call.
LF_API std::vector<std::shared_ptr<torch::nn::Module>> wrap_matching_modules(torch::nn::Module& root,
                                                                            const ModulePolicy& policy);

}  // namespace lightning::fabric
