// The objects Fabric::setup returns: FabricModule (forward through the precision and device),
// FabricOptimizer (step through the strategy), FabricDataLoader (batches on the device). Each
// keeps the original reachable; none copies parameters.
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/record_function.h>
#include <torch/data/dataloader.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#ifdef LF_TORCH_HAS_CUDA  // data_parallel needs CUDA headers (set for a CUDA LibTorch)
#include <torch/nn/parallel/data_parallel.h>
#endif

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "lightning/fabric/callbacks/callback.h"
#include "lightning/fabric/checkpoint/state_dict.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/strategies/strategy.h"
#include "lightning/fabric/utilities/apply_func.h"
#include "lightning/fabric/utilities/data.h"
#include "lightning/fabric/utilities/nonfinite.h"
#include "lightning/fabric/utilities/profiler.h"

namespace lightning::fabric {

namespace detail {
/// RAII marker of a Fabric::backward in progress (process-wide: autograd may run hooks on its
/// own device threads). The output hook of FabricModule checks it.
class LF_API BackwardScope {
 public:
  BackwardScope();
  ~BackwardScope();
  BackwardScope(const BackwardScope&) = delete;
  BackwardScope& operator=(const BackwardScope&) = delete;
  static bool active();
};

/// Throws RuntimeError telling the user to call fabric.backward(loss) unless a BackwardScope is
/// active. Runs as a gradient hook on every FabricModule output that requires grad.
LF_API void check_backward_through_fabric();
}  // namespace detail

/// A set-up module. forward(args...) accepts whatever the original forward accepts: tensors
/// (also inside vectors, tuples, maps, optionals) are moved to the strategy's device and cast by
/// the precision plugin; the forward runs inside the precision's context; tensor outputs are
/// cast back and guarded so that loss.backward() reports that fabric.backward(loss) is needed.
template <class ModuleImpl>
class FabricModule {
 public:
  FabricModule(std::shared_ptr<ModuleImpl> module, std::shared_ptr<Strategy> strategy)
      : module_(std::move(module)), strategy_(std::move(strategy)) {}

  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    auto forward_of = [](ModuleImpl& module, auto&&... prepared) -> decltype(auto) {
      return module.forward(std::forward<decltype(prepared)>(prepared)...);
    };
    return invoke</*is_forward=*/true>(forward_of, std::forward<Args>(args)...);
  }

  /// Runs another entry point of the module the way forward runs (Python's
  /// mark_forward_method): inputs moved to the device and cast, the strategy's preparation (fsdp
  /// gathers the parameters), the precision's autocast, outputs cast back and guarded. method is
  /// a member function of the module or any callable taking (ModuleImpl&, args...):
  ///   auto tokens = model.call(&GptImpl::generate, prompt, 20);
  ///   auto score = model.call([](NetImpl& net, const at::Tensor& x) { return net.score(x, 3); }, x);
  /// Calling model->generate(x) directly bypasses all of that (under fsdp it would see 0-element
  /// parameters). strategy "dp" splits forward only, and refuses call().
  template <class Method, class... Args>
  decltype(auto) call(Method&& method, Args&&... args) {
    return invoke</*is_forward=*/false>(std::forward<Method>(method), std::forward<Args>(args)...);
  }

  template <class... Args>
  decltype(auto) operator()(Args&&... args) { return forward(std::forward<Args>(args)...); }

 private:
  template <bool IsForward, class Method, class... Args>
  decltype(auto) invoke(Method&& method, Args&&... args) {
    RECORD_USER_SCOPE("lf::forward");  // a profiler range (utilities/profiler.h); free when none runs
    const Precision& precision = *strategy_->precision();
    const torch::Device device = strategy_->root_device();
    strategy_->before_forward(*module_);
    auto nonfinite = detail::watch_forward_for_nonfinite(*module_);  // a no-op unless detection is on
    auto prepare = [&](const at::Tensor& tensor) {
      return strategy_->convert_input(precision.convert_input(tensor.device() == device ? tensor : tensor.to(device)));
    };
    using Output = decltype(std::invoke(method, *module_, apply_to_tensors(std::forward<Args>(args), prepare)...));
    if constexpr (std::is_void_v<Output>) {
      auto context = precision.forward_context();
      try {
        std::invoke(method, *module_, apply_to_tensors(std::forward<Args>(args), prepare)...);
      } catch (const std::exception& error) {
        strategy_->annotate_forward_error(*module_, error);
        throw;
      }
    } else {
      // The forward runs inside the precision's context; outputs are converted after it ended.
      std::optional<std::decay_t<Output>> output;
      {
        auto context = precision.forward_context();
        const auto& split_devices = strategy_->data_parallel_devices();
        try {
          if (split_devices.size() > 1) {
            if constexpr (IsForward) {
              output.emplace(data_parallel_forward<std::decay_t<Output>>(split_devices, prepare, std::forward<Args>(args)...));
            } else {
              throw ValueError(
                  "FabricModule::call: strategy=\"dp\" splits a batch over devices for forward only (LibTorch's "
                  "data_parallel replicates forward). Run this method through forward, or use strategy=\"ddp\".");
            }
          } else {
            output.emplace(std::invoke(method, *module_, apply_to_tensors(std::forward<Args>(args), prepare)...));
          }
        } catch (const std::exception& error) {
          strategy_->annotate_forward_error(*module_, error);
          throw;
        }
      }
      return apply_to_tensors(std::move(*output), [&precision](const at::Tensor& tensor) {
        at::Tensor result = precision.convert_output(tensor);
        if (result.requires_grad()) {
          result.register_hook([](const at::Tensor&) { detail::check_backward_through_fabric(); });
        }
        return result;
      });
    }
  }

  // strategy "dp": scatter the batch over the devices, replicas forward, gather on the first.
  template <class Output, class Prepare, class... Args>
  Output data_parallel_forward(const std::vector<torch::Device>& devices, Prepare& prepare, Args&&... args) {
#ifndef LF_TORCH_HAS_CUDA
    (void)devices, (void)prepare, ((void)args, ...);
    throw RuntimeError("strategy=\"dp\" needs a CUDA LibTorch; this build has none.");
#else
    constexpr bool splittable = sizeof...(Args) == 1 && (std::is_convertible_v<Args, at::Tensor> && ...) &&
                                std::is_same_v<Output, at::Tensor> &&
                                std::is_base_of_v<torch::nn::Cloneable<ModuleImpl>, ModuleImpl>;
    if constexpr (splittable) {
      return torch::nn::parallel::data_parallel(module_, prepare(at::Tensor(std::forward<Args>(args))...), devices,
                                                devices.front());
    } else {
      throw ValueError(
          "strategy=\"dp\" splits a batch over devices with LibTorch's data_parallel, which needs a module "
          "deriving from torch::nn::Cloneable (a TORCH_MODULE) whose forward takes one tensor and returns one. "
          "This module's forward does not; use strategy=\"ddp\" (one process per device).");
    }
#endif
  }

 public:

  /// The original module (its members and methods).
  ModuleImpl* operator->() const { return module_.get(); }
  ModuleImpl& operator*() const { return *module_; }
  const std::shared_ptr<ModuleImpl>& module() const { return module_; }

  /// Parameters and buffers under the original module's names (no wrapper prefix), as CPU
  /// tensors: lf::module_state_dict, what checkpoints store.
  StateDict state_dict() const { return module_state_dict(*module_); }
  /// Copies values in place; strict: every key must match both ways (RuntimeError listing them).
  void load_state_dict(const StateDict& state, bool strict = true) { load_module_state_dict(*module_, state, strict); }
  std::vector<at::Tensor> parameters(bool recurse = true) const { return module_->parameters(recurse); }
  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }
  bool is_training() const { return module_->is_training(); }

 private:
  std::shared_ptr<ModuleImpl> module_;
  std::shared_ptr<Strategy> strategy_;
};

/// A set-up optimizer. step() goes through the strategy and precision plugin (which may skip it,
/// e.g. a loss scaler after an overflow). The original stays reachable via optimizer() and ->.
/// Steps run through ATen's fused kernels whenever fused_step covers the optimizer
/// (utilities/fused_step.h: Adam, AdamW, SGD, Adagrad), unless fusing was turned off at setup.
class LF_API FabricOptimizer {
 public:
  using Callbacks = std::vector<std::shared_ptr<Callback>>;
  /// observer (may be null) is told of every step: Fabric's profiler switch counts them.
  /// callbacks (may be null): the Fabric's, whose on_after_optimizer_step follows every step.
  FabricOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<Strategy> strategy,
                  bool fuse_steps = true, std::shared_ptr<StepObserver> observer = nullptr,
                  std::shared_ptr<const Callbacks> callbacks = nullptr)
      : optimizer_(std::move(optimizer)), strategy_(std::move(strategy)), fuse_steps_(fuse_steps),
        observer_(std::move(observer)), callbacks_(std::move(callbacks)) {}

  /// One optimizer step; returns false when the precision plugin skipped it.
  bool step(const torch::optim::Optimizer::LossClosure& closure = nullptr);
  /// Whether the next step runs through the fused kernels (checked before every step: a
  /// gradient that turns sparse, for example, makes that step LibTorch's).
  bool fused() const { return !why_not_fused(); }
  /// Why the next step is LibTorch's own, or nullopt when it is fused.
  std::optional<std::string> why_not_fused() const;
  /// Clears gradients. Default: releases them (set_to_none, the default of LibTorch 2.x and
  /// Python), so the next backward writes fresh gradients instead of adding to zeros;
  /// set_to_none=false zeroes them in place.
  void zero_grad(bool set_to_none = true);

  torch::optim::Optimizer& optimizer() const { return *optimizer_; }
  torch::optim::Optimizer* operator->() const { return optimizer_.get(); }
  std::vector<torch::optim::OptimizerParamGroup>& param_groups() { return optimizer_->param_groups(); }

 private:
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::shared_ptr<Strategy> strategy_;
  bool fuse_steps_;
  std::shared_ptr<StepObserver> observer_;
  std::shared_ptr<const Callbacks> callbacks_;
  /// What follows every step, a CapturedStep's replays included: the observer, then the callbacks.
  void after_step();
  /// True while a CapturedStep runs its user's step function, which must leave step() and
  /// zero_grad() to it: both refuse then (ValueError naming the fix).
  bool inside_captured_step_ = false;
  friend class CapturedStep;  // its replays are steps too: it calls after_step()
};

/// A data loader whose batches arrive on the strategy's device. Iterate it as the inner loader.
template <class Loader>
class FabricDataLoader {
 public:
  using Batch = typename Loader::BatchType;

  /// set_epoch: reaches the loader's DistributedSampler (null for a loader the user built).
  /// progress: where the loop stands, for exact resume (null: not tracked).
  FabricDataLoader(std::unique_ptr<Loader> loader, std::optional<torch::Device> device,
                   std::optional<size_t> num_batches, std::function<void(int64_t)> set_epoch = nullptr,
                   std::shared_ptr<LoaderProgress> progress = nullptr)
      : loader_(std::move(loader)),
        device_(device),
        num_batches_(num_batches),
        set_epoch_(std::move(set_epoch)),
        progress_(std::move(progress)) {}

  class iterator {
   public:
    iterator(torch::data::Iterator<Batch> inner, std::optional<torch::Device> device, LoaderProgress* progress = nullptr)
        : inner_(std::move(inner)), device_(device), progress_(progress) {}
    Batch& operator*() {
      if (!current_) {
        current_ = device_ ? move_data_to_device(*inner_, *device_) : *inner_;
        if (progress_ != nullptr) ++progress_->batches;
      }
      return *current_;
    }
    Batch* operator->() { return &**this; }
    iterator& operator++() {
      ++inner_;
      current_.reset();
      return *this;
    }
    bool operator==(const iterator& other) const {
      const bool equal = inner_ == other.inner_;
      if (equal && progress_ != nullptr && other.progress_ == nullptr) progress_->finished = true;  // reached end()
      return equal;
    }
    bool operator!=(const iterator& other) const { return !(*this == other); }

   private:
    torch::data::Iterator<Batch> inner_;
    std::optional<torch::Device> device_;
    LoaderProgress* progress_;  // null for end()
    std::optional<Batch> current_;
  };

  /// Starts an epoch: the distributed sampler reshuffles for the next epoch.
  iterator begin() {
    iterator first(loader_->begin(), device_, progress_.get());  // the sampler's reset: its epoch, its skip
    if (progress_) progress_->begin_pass();
    return first;
  }
  iterator end() { return iterator(loader_->end(), device_); }

  /// Batches per epoch on this rank, when known.
  std::optional<size_t> size() const { return num_batches_; }
  Loader& loader() const { return *loader_; }
  /// The next iteration shuffles as epoch `epoch` (0-based) does; epochs otherwise advance by one
  /// per iteration. Resuming mid-run calls it so the order matches the interrupted run.
  void set_epoch(int64_t epoch) {
    LF_CHECK(set_epoch_ != nullptr, ValueError, "set_epoch: this loader was built by you, so Fabric does not own its ",
             "sampler; call set_epoch on your DistributedSampler instead.");
    set_epoch_(epoch);
  }

 private:
  std::unique_ptr<Loader> loader_;
  std::optional<torch::Device> device_;
  std::optional<size_t> num_batches_;
  std::function<void(int64_t)> set_epoch_;
  std::shared_ptr<LoaderProgress> progress_;
};

}  // namespace lightning::fabric
