// What Fabric::save writes and Fabric::load restores: a State maps names to entries, each a live
// object restored in place (module, optimizer, LR scheduler, loss scaler), a plain value that load
// replaces (number, bool, string, tensor, list or dict: anything a c10::IValue holds), or a nested
// State. Live objects are borrowed: the caller keeps them alive until save/load returns.
//   lf::State state{{"model", model}, {"optimizer", optimizer}, {"step", step}};
//   fabric.save("ck/last.ckpt", state);
//   fabric.load("ck/last.ckpt", state);   step = state.at("step").to<int64_t>();
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>

#include "lightning/fabric/checkpoint/state_fwd.h"
#include "lightning/fabric/plugins/precision/loss_scaler.h"
#include "lightning/fabric/wrappers.h"

namespace lightning::fabric {

class StateEntry {
 public:
  enum class Kind { Module, Optimizer, Scheduler, LossScaler, Value, Nested };

  StateEntry(std::shared_ptr<torch::nn::Module> module) : kind_(Kind::Module), module_(std::move(module)) {}
  template <class M>
  StateEntry(const torch::nn::ModuleHolder<M>& module) : StateEntry(std::shared_ptr<torch::nn::Module>(module.ptr())) {}
  template <class M>
  StateEntry(const FabricModule<M>& module) : StateEntry(std::shared_ptr<torch::nn::Module>(module.module())) {}
  StateEntry(torch::optim::Optimizer& optimizer) : kind_(Kind::Optimizer), optimizer_(&optimizer) {}
  StateEntry(FabricOptimizer& optimizer) : StateEntry(optimizer.optimizer()) {}
  StateEntry(torch::optim::LRScheduler& scheduler) : kind_(Kind::Scheduler), scheduler_(&scheduler) {}
  StateEntry(std::shared_ptr<LossScaler> scaler) : kind_(Kind::LossScaler), scaler_(std::move(scaler)) {}
  StateEntry(State nested) : kind_(Kind::Nested), nested_(std::make_shared<State>(std::move(nested))) {}
  /// A plain value: anything c10::IValue is constructible from (int, double, bool, std::string,
  /// const char*, at::Tensor, c10::List, c10::Dict, ...).
  template <class T, std::enable_if_t<std::is_constructible_v<c10::IValue, T&&> &&
                                          !std::is_base_of_v<StateEntry, std::decay_t<T>>,
                                      int> = 0>
  StateEntry(T&& value) : kind_(Kind::Value), value_(std::forward<T>(value)) {}

  Kind kind() const { return kind_; }
  /// The plain value (after load: the file's value). RuntimeError for other kinds.
  const c10::IValue& value() const;
  template <class T>
  T to() const { return value().to<T>(); }
  torch::nn::Module& module() const;
  torch::optim::Optimizer& optimizer() const;
  torch::optim::LRScheduler& scheduler() const;
  LossScaler& loss_scaler() const;
  State& nested() const;

  /// Replaces a plain value (load does this).
  void set_value(c10::IValue value);

 private:
  Kind kind_;
  std::shared_ptr<torch::nn::Module> module_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  torch::optim::LRScheduler* scheduler_ = nullptr;
  std::shared_ptr<LossScaler> scaler_;
  std::shared_ptr<State> nested_;
  c10::IValue value_;
};

}  // namespace lightning::fabric
