#include "lightning/fabric/plugins/precision/loss_scaler.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <torch/types.h>

#include <map>
#include <vector>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace {
// Gradients of the optimizer's parameters, grouped by device (sparse gradients are coalesced first).
std::map<std::string, std::vector<at::Tensor>> gradients_by_device(torch::optim::Optimizer& optimizer) {
  std::map<std::string, std::vector<at::Tensor>> groups;
  for (auto& group : optimizer.param_groups()) {
    for (auto& parameter : group.params()) {
      at::Tensor grad = parameter.grad();
      if (!grad.defined()) continue;
      LF_CHECK(grad.scalar_type() != torch::kFloat16, ValueError,
               "LossScaler: a gradient is float16; unscaling it would underflow. Keep parameters in float32 "
               "under \"16-mixed\" (autocast runs the forward in float16), or use \"16-true\" without a scaler.");
      if (grad.is_sparse()) grad = grad.coalesce()._values();
      groups[grad.device().str()].push_back(grad);
    }
  }
  return groups;
}
}  // namespace

LossScaler::LossScaler(LossScalerOptions options) : options_(options) {
  LF_CHECK(options_.init_scale > 0, ValueError, "LossScaler: init_scale=", options_.init_scale,
           " must be positive (PyTorch's default is 65536).");
  LF_CHECK(options_.growth_factor > 1.0, ValueError, "LossScaler: growth_factor=", options_.growth_factor,
           " must be greater than 1 (default 2).");
  LF_CHECK(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0, ValueError,
           "LossScaler: backoff_factor=", options_.backoff_factor, " must lie in (0, 1) (default 0.5).");
  LF_CHECK(options_.growth_interval >= 1, ValueError, "LossScaler: growth_interval=", options_.growth_interval,
           " must be at least 1 (default 2000).");
  ensure_tensors(torch::kCPU);
}

void LossScaler::ensure_tensors(const at::Device& device) {
  if (!scale_.defined()) {
    scale_ = torch::full({}, options_.init_scale, torch::TensorOptions().dtype(torch::kFloat32).device(device));
    growth_tracker_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt32).device(device));
  } else if (scale_.device() != device) {
    scale_ = scale_.to(device);
    growth_tracker_ = growth_tracker_.to(device);
  }
}

at::Tensor LossScaler::scale(const at::Tensor& loss) {
  ensure_tensors(loss.device());
  scaled_since_update_ = true;
  return loss * scale_.to(loss.scalar_type());
}

void LossScaler::unscale_(torch::optim::Optimizer& optimizer) { check_gradients(optimizer, /*unscale=*/true); }

void LossScaler::check_gradients(torch::optim::Optimizer& optimizer, bool unscale) {
  auto& state = per_optimizer_[&optimizer];
  LF_CHECK(state.stage != Stage::kUnscaled, RuntimeError,
           "LossScaler::unscale_ was already called for this optimizer since the last update(): gradients "
           "are unscaled once per step (clip_gradients and the optimizer step share it).");
  LF_CHECK(state.stage != Stage::kStepped, RuntimeError,
           "LossScaler::unscale_ was called after step() for this optimizer: unscale before stepping.");
  const at::Tensor inv_scale =
      unscale ? scale_.to(torch::kFloat64).reciprocal().to(torch::kFloat32) : torch::ones_like(scale_);
  at::Tensor found_inf = torch::zeros({}, scale_.options().dtype(torch::kFloat32));
  const auto groups = gradients_by_device(optimizer);
  LF_CHECK(groups.empty() || scaled_since_update_, RuntimeError,
           "The optimizer has gradients, but no loss was scaled since the last step: the backward bypassed "
           "fabric.backward(loss) (e.g. loss.backward() on the raw module's output), so the loss scaler of "
           "precision=\"16-mixed\" would divide unscaled gradients. Call fabric.backward(loss).");
  for (const auto& [device_name, grads] : groups) {
    const at::Device device(device_name);
    at::Tensor device_inf = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
    const at::Tensor device_inv = inv_scale.to(device);
    at::_amp_foreach_non_finite_check_and_unscale_(grads, device_inf, device_inv);
    found_inf.add_(device_inf.to(found_inf.device()));
  }
  found_inf.clamp_max_(1.0);  // 1, not a count of devices: the fused kernels skip only on exactly 1
  if (found_inf_reducer_) found_inf_reducer_(found_inf);  // every rank skips when any shard overflowed
  state.found_inf = found_inf;
  state.stage = unscale ? Stage::kUnscaled : Stage::kChecked;
}

bool LossScaler::step(torch::optim::Optimizer& optimizer, StepKernel kernel) {
  LF_CHECK(per_optimizer_[&optimizer].stage != Stage::kStepped, RuntimeError,
           "LossScaler::step was already called for this optimizer since the last update(): call update() "
           "once per iteration, after the optimizers stepped.");
  if (per_optimizer_[&optimizer].stage == Stage::kReady) check_gradients(optimizer, kernel == StepKernel::LibTorch);
  auto& state = per_optimizer_[&optimizer];
  bool finite = false;
  if (kernel == StepKernel::Fused) {
    const at::Tensor grad_scale = state.stage == Stage::kChecked ? scale_ : at::Tensor();
    finite = fused_step(optimizer, FusedStepScaling{grad_scale, state.found_inf});
  } else {
    finite = state.found_inf.item<float>() == 0.0f;
    if (finite) optimizer.step();
  }
  state.stage = Stage::kStepped;
  return finite;
}

void LossScaler::update() {
  at::Tensor found_inf = torch::zeros({}, scale_.options().dtype(torch::kFloat32));
  bool any = false;
  for (auto& [optimizer, state] : per_optimizer_) {
    if (!state.found_inf.defined()) continue;
    found_inf.add_(state.found_inf.to(found_inf.device()));
    any = true;
  }
  per_optimizer_.clear();
  scaled_since_update_ = false;
  if (!any) return;  // nothing was unscaled since the last update
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf, options_.growth_factor, options_.backoff_factor,
                         options_.growth_interval);
}

double LossScaler::get_scale() const { return scale_.item<double>(); }

int64_t LossScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

StateDict LossScaler::state_dict() const {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("scale", get_scale());
  state.insert("growth_factor", options_.growth_factor);
  state.insert("backoff_factor", options_.backoff_factor);
  state.insert("growth_interval", options_.growth_interval);
  state.insert("_growth_tracker", growth_tracker());
  return state;
}

namespace {
c10::IValue required(const c10::impl::GenericDict& state, const std::string& key) {
  auto found = state.find(key);
  LF_CHECK(found != state.end(), ValueError, "LossScaler::load_state_dict: key \"", key,
           "\" is missing; expected scale, growth_factor, backoff_factor, growth_interval, _growth_tracker.");
  return found->value();
}
double required_number(const c10::impl::GenericDict& state, const std::string& key) {
  const c10::IValue value = required(state, key);
  LF_CHECK(value.isDouble() || value.isInt(), ValueError, "LossScaler::load_state_dict: \"", key,
           "\" must be a number, got ", value.tagKind(), ".");
  return value.isDouble() ? value.toDouble() : static_cast<double>(value.toInt());
}
}  // namespace

void LossScaler::load_state_dict(const StateDict& state) {
  LossScalerOptions restored;
  restored.init_scale = required_number(state, "scale");
  restored.growth_factor = required_number(state, "growth_factor");
  restored.backoff_factor = required_number(state, "backoff_factor");
  restored.growth_interval = static_cast<int64_t>(required_number(state, "growth_interval"));
  const auto tracker = static_cast<int64_t>(required_number(state, "_growth_tracker"));
  LossScaler validated(restored);  // the same checks as the constructor
  options_ = validated.options_;
  scale_.fill_(restored.init_scale);
  growth_tracker_.fill_(tracker);
  per_optimizer_.clear();
  scaled_since_update_ = false;
}

}  // namespace lightning::fabric
