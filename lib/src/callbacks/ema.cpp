#include "lightning/fabric/callbacks/ema.h"

#include <ATen/ATen.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <sstream>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/fabric.h"
#include "lightning/fabric/strategies/strategy.h"

namespace lightning::fabric {

// One averaged tensor: this rank's part of a parameter (Strategy::trained_parts) or a buffer.
struct EMA::Tracked {
  std::string key;             // "module.<name>", as AveragedModel's state dict
  std::vector<int64_t> shape;  // the full tensor's
  at::Tensor live;             // what the model (or the optimizer, e.g. fsdp's shard) holds
  at::Tensor average;          // shaped like live
  bool parameter = true;
  // Parameters: the full value from every rank's averages (collective), and this rank's part of a
  // full value. Unset for buffers, which every rank holds whole.
  std::function<at::Tensor(const at::Tensor&)> gather;
  std::function<at::Tensor(const at::Tensor&)> cut;
};

EMA::EMA(EMAOptions options) : options_(std::move(options)) {
  LF_CHECK(options_.decay >= 0.0 && options_.decay <= 1.0, ValueError, "EMAOptions::decay is ", options_.decay,
           "; it must be in [0, 1] (0.999 is the usual choice).");
  LF_CHECK(options_.update_every_n_steps >= 0, ValueError, "EMAOptions::update_every_n_steps is ",
           options_.update_every_n_steps, "; it must be 0 (never) or more.");
}

EMA::~EMA() = default;

bool EMA::should_update(int64_t step_idx) const {
  const bool started = !options_.update_starting_at_step || step_idx >= *options_.update_starting_at_step;
  return started && options_.update_every_n_steps > 0 && step_idx % options_.update_every_n_steps == 0;
}

void EMA::follow(const std::shared_ptr<torch::nn::Module>& module, Strategy& strategy) { bind(module, &strategy); }

void EMA::on_after_setup(const HookArgs& args) {
  if (!module_.expired()) return;  // follows the first module set up
  bind(args.get<std::shared_ptr<torch::nn::Module>>("module"), args.get<Fabric*>("fabric")->strategy().get());
}

void EMA::bind(const std::shared_ptr<torch::nn::Module>& module, Strategy* strategy) {
  LF_CHECK(module != nullptr, ValueError, "EMA::follow: no module given.");
  LF_CHECK(strategy != nullptr, ValueError, "EMA::follow: no strategy given; pass *fabric.strategy().");
  std::vector<Tracked> tracked;
  for (auto& part : strategy->trained_parts(*module)) {
    tracked.push_back({"module." + part.name, std::move(part.full_shape), part.tensor, {}, true, std::move(part.gather),
                       std::move(part.cut)});
  }
  for (const auto& item : module->named_buffers()) {
    tracked.push_back({"module." + item.key(), item.value().sizes().vec(), item.value(), {}, false, nullptr, nullptr});
  }
  for (auto& entry : tracked) entry.average = entry.live.detach().clone();
  tracked_ = std::move(tracked);
  stepped_.clear();
  for (const auto& entry : tracked_) {
    if (entry.parameter) stepped_.insert(entry.live.unsafeGetTensorImpl());
  }
  module_ = module;
  strategy_ = strategy;
  if (pending_) apply_loaded();
}

void EMA::require_bound(const char* call) const {
  LF_CHECK(!module_.expired(), RuntimeError, "EMA::", call, ": no module to average. Register the EMA as a callback "
           "before fabric.setup(module, ...) (it follows the first module set up), or call follow(module, strategy).");
}

void EMA::on_after_optimizer_step(const HookArgs& args) {
  if (module_.expired()) return;
  const auto* optimizer = args.get<torch::optim::Optimizer*>("optimizer");
  bool steps_module = false;  // one lookup per parameter until a hit: cheap on every step
  for (const auto& group : optimizer->param_groups()) {
    for (const auto& parameter : group.params()) {
      steps_module = stepped_.count(parameter.unsafeGetTensorImpl()) != 0;
      if (steps_module) break;
    }
    if (steps_module) break;
  }
  if (!steps_module) return;  // another model's optimizer (a GAN's other half)
  const int64_t step_idx = step_++;
  if (step_ <= latest_update_step_ || !should_update(step_idx)) return;
  torch::NoGradGuard no_grad;
  for (auto& entry : tracked_) {
    const at::Tensor live = entry.live.detach();
    if (n_averaged_ == 0 || (!entry.parameter && !options_.use_buffers)) {
      entry.average.copy_(live);
    } else {  // AveragedModel with get_ema_avg_fn, in the same operations (integers truncate, as there)
      entry.average.copy_(entry.average * options_.decay + live * (1.0 - options_.decay));
    }
  }
  ++n_averaged_;
  latest_update_step_ = step_;
}

void EMA::swap_values() {
  torch::NoGradGuard no_grad;
  for (auto& entry : tracked_) {
    at::Tensor held = entry.live.detach().clone();
    entry.live.detach().copy_(entry.average);
    entry.average.copy_(held);
  }
  strategy_->trained_tensors_changed();
}

ScopeGuard EMA::swap_into_model() {
  require_bound("swap_into_model");
  swap_values();
  return ScopeGuard([this] { swap_values(); });
}

void EMA::copy_to_model() {
  require_bound("copy_to_model");
  torch::NoGradGuard no_grad;
  for (auto& entry : tracked_) entry.live.detach().copy_(entry.average);
  strategy_->trained_tensors_changed();
}

StateDict EMA::state_dict() const {
  if (module_.expired() && pending_) return *pending_;
  StateDict state = make_state_dict();
  state.insert("n_averaged", at::scalar_tensor(n_averaged_, at::kLong));
  state.insert("step", step_);
  state.insert("latest_update_step", latest_update_step_);
  for (const auto& entry : tracked_) {
    state.insert(entry.key, entry.gather ? entry.gather(entry.average) : entry.average.clone());
  }
  return state;
}

void EMA::load_state_dict(const StateDict& state) {
  for (const char* key : {"n_averaged", "step", "latest_update_step"}) {
    LF_CHECK(state.contains(key), ValueError, "EMA::load_state_dict: the entry has no '", key,
             "'; pass what EMA::state_dict() saved.");
  }
  const c10::IValue averaged = state.at("n_averaged");
  n_averaged_ = averaged.isTensor() ? averaged.toTensor().item<int64_t>() : averaged.toInt();
  step_ = state.at("step").toInt();
  latest_update_step_ = state.at("latest_update_step").toInt();
  pending_ = state.copy();
  if (!module_.expired()) apply_loaded();
}

void EMA::apply_loaded() {
  const StateDict state = std::move(*pending_);
  pending_.reset();
  torch::NoGradGuard no_grad;
  for (auto& entry : tracked_) {
    LF_CHECK(state.contains(entry.key), ValueError, "EMA::load_state_dict: the entry has no '", entry.key,
             "', which the followed module has; was it saved from another model?");
    const at::Tensor full = state.at(entry.key).toTensor();
    LF_CHECK(full.numel() == c10::multiply_integers(entry.shape), ValueError, "EMA::load_state_dict: '", entry.key,
             "' has shape ", full.sizes(), " in the entry but ", at::IntArrayRef(entry.shape), " in the module.");
    const at::Tensor whole = full.reshape(entry.shape);
    entry.average.copy_(entry.cut ? entry.cut(whole) : whole);
  }
}

}  // namespace lightning::fabric
