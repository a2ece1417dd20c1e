// What Fabric::save writes and Fabric::load restores: a State maps names to entries, each
//   - a live object restored in place: a module, an optimizer, an LR scheduler, Fabric's wrappers
//     of them, the loss scaler, or any object of yours that derives from Stateful (stateful.h);
//   - a plain value that load replaces (number, bool, string, tensor, list or dict: anything a
//     c10::IValue holds);
//   - or a nested State.
// Live objects passed by reference are borrowed: the caller keeps them alive until save/load
// returns; a std::shared_ptr is shared.
//   lf::State state{{"model", model}, {"optimizer", optimizer}, {"step", step}};
//   fabric.save("ck/last.ckpt", state);
//   fabric.load("ck/last.ckpt", state);   step = state.at("step").to<int64_t>();
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "lightning/fabric/checkpoint/state_fwd.h"
#include "lightning/fabric/checkpoint/stateful.h"

namespace lightning::fabric {

namespace detail {
// Wrappers that hand out the module or optimizer they wrap (FabricModule, FabricOptimizer).
template <class T, class = void>
struct wraps_module : std::false_type {};
template <class T>
struct wraps_module<T, std::void_t<decltype(std::shared_ptr<torch::nn::Module>(std::declval<const T&>().module()))>>
    : std::true_type {};
template <class T>
struct is_shared_ptr : std::false_type {};
template <class T>
struct is_shared_ptr<std::shared_ptr<T>> : std::true_type {};
template <class T, class = void>
struct wraps_optimizer : std::false_type {};
template <class T>
struct wraps_optimizer<T, std::void_t<decltype(static_cast<torch::optim::Optimizer&>(std::declval<T&>().optimizer()))>>
    : std::true_type {};
}  // namespace detail

class LF_API StateEntry {
 public:
  enum class Kind { Object, Value, Nested };

  StateEntry(std::shared_ptr<torch::nn::Module> module);
  template <class M>
  StateEntry(const torch::nn::ModuleHolder<M>& module) : StateEntry(std::shared_ptr<torch::nn::Module>(module.ptr())) {}
  StateEntry(torch::optim::Optimizer& optimizer);
  StateEntry(torch::optim::LRScheduler& scheduler);
  /// Your own object, shared (also the loss scaler's shared_ptr). A null pointer is refused at save/load.
  StateEntry(std::shared_ptr<Stateful> object);
  template <class T, std::enable_if_t<std::is_base_of_v<Stateful, T> && !std::is_same_v<Stateful, T>, int> = 0>
  StateEntry(std::shared_ptr<T> object) : StateEntry(std::static_pointer_cast<Stateful>(std::move(object))) {}
  /// Your own object, borrowed.
  template <class T, std::enable_if_t<std::is_base_of_v<Stateful, T>, int> = 0>
  StateEntry(T& object) : StateEntry(std::shared_ptr<Stateful>(std::shared_ptr<Stateful>(), &object)) {}
  /// A FabricModule (its module).
  template <class W, std::enable_if_t<detail::wraps_module<W>::value && !std::is_base_of_v<Stateful, W>, int> = 0>
  StateEntry(const W& wrapper) : StateEntry(std::shared_ptr<torch::nn::Module>(wrapper.module())) {}
  /// A FabricOptimizer (its optimizer).
  template <class W, std::enable_if_t<detail::wraps_optimizer<W>::value && !std::is_base_of_v<Stateful, W>, int> = 0>
  StateEntry(W& wrapper) : StateEntry(static_cast<torch::optim::Optimizer&>(wrapper.optimizer())) {}
  StateEntry(State nested);
  /// A plain value: anything c10::IValue is constructible from (int, double, bool, std::string,
  /// const char*, at::Tensor, c10::List, c10::Dict, ...).
  template <class T, std::enable_if_t<std::is_constructible_v<c10::IValue, T&&> &&
                                          !std::is_base_of_v<StateEntry, std::decay_t<T>> &&
                                          !std::is_base_of_v<Stateful, std::decay_t<T>> &&
                                          !detail::is_shared_ptr<std::decay_t<T>>::value,
                                      int> = 0>
  StateEntry(T&& value) : kind_(Kind::Value), value_(std::forward<T>(value)) {}

  Kind kind() const { return kind_; }
  /// The plain value (after load: the file's value). RuntimeError for other kinds.
  const c10::IValue& value() const;
  template <class T>
  T to() const { return value().to<T>(); }
  /// The live object (RuntimeError for other kinds, or a null one).
  Stateful& object() const;
  State& nested() const;
  /// The module or optimizer behind a live entry, else null: strategies that shard modules and
  /// optimizers (fsdp) save and restore those entries their own way.
  torch::nn::Module* module() const { return module_.get(); }
  torch::optim::Optimizer* optimizer() const { return optimizer_; }

  /// Replaces a plain value (load does this).
  void set_value(c10::IValue value);

 private:
  Kind kind_;
  std::shared_ptr<Stateful> object_;
  std::shared_ptr<torch::nn::Module> module_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  std::shared_ptr<State> nested_;
  c10::IValue value_;
};

}  // namespace lightning::fabric
