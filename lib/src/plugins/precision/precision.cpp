#include "lightning/fabric/plugins/precision/precision.h"

#include <ATen/autocast_mode.h>
#include <c10/core/DefaultDtype.h>
#include <torch/types.h>

#include <array>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

void Precision::convert_module(torch::nn::Module& module) const {
  if (auto dtype = module_dtype()) module.to(*dtype);
}

at::Tensor Precision::convert_input(const at::Tensor& input) const {
  const auto dtype = module_dtype();
  if (!dtype || !input.is_floating_point() || input.scalar_type() == *dtype) return input;
  return input.to(*dtype);
}

ScopeGuard Precision::tensor_init_context() const {
  if (auto dtype = module_dtype()) return default_dtype_guard(*dtype);
  return ScopeGuard();
}

void Precision::backward(at::Tensor& loss, const BackwardOptions& options) const {
  std::optional<at::TensorList> inputs;
  if (!options.inputs.empty()) inputs = options.inputs;
  loss.backward({}, options.retain_graph, options.create_graph, inputs);
}

namespace {
// Floating tensors to the default dtype (float32), others unchanged.
at::Tensor to_default_dtype(const at::Tensor& tensor) {
  const auto target = c10::typeMetaToScalarType(c10::get_default_dtype());
  if (!tensor.defined() || !tensor.is_floating_point() || tensor.scalar_type() == target) return tensor;
  return tensor.to(target);
}
}  // namespace

at::Tensor TruePrecision::convert_output(const at::Tensor& output) const { return to_default_dtype(output); }

MixedPrecision::MixedPrecision(std::string name, c10::ScalarType dtype, std::shared_ptr<LossScaler> scaler)
    : name_(std::move(name)), dtype_(dtype), scaler_(std::move(scaler)) {
  LF_CHECK(dtype_ == torch::kBFloat16 || dtype_ == torch::kFloat16, ValueError, "MixedPrecision(\"", name_,
           "\"): the autocast dtype must be bfloat16 or float16, got ", c10::toString(dtype_), ".");
}

void MixedPrecision::pre_backward(at::Tensor& loss) const {
  if (scaler_) loss = scaler_->scale(loss);
}

bool MixedPrecision::optimizer_step(torch::optim::Optimizer& optimizer,
                                    const torch::optim::Optimizer::LossClosure& closure, StepKernel kernel) const {
  if (!scaler_) return Precision::optimizer_step(optimizer, closure, kernel);
  LF_CHECK(!closure, ValueError, "optimizer.step(closure): precision=\"", name_,
           "\" scales the loss and may skip steps, which a closure that re-evaluates the loss (LBFGS) cannot "
           "follow. Use precision=\"bf16-mixed\" or \"32-true\" with closure-based optimizers.");
  const bool stepped = scaler_->step(optimizer, kernel);
  scaler_->update();
  return stepped;
}

void MixedPrecision::unscale_gradients(torch::optim::Optimizer& optimizer) const {
  if (scaler_) scaler_->unscale_(optimizer);
}

at::Tensor MixedPrecision::convert_input(const at::Tensor& input) const {
  if (!input.is_floating_point() || input.scalar_type() == dtype_) return input;
  return input.to(dtype_);
}

at::Tensor MixedPrecision::convert_output(const at::Tensor& output) const { return to_default_dtype(output); }

ScopeGuard MixedPrecision::forward_context() const {
  // Autocast for the device type in use only (LibTorch 2.x autocasts bfloat16 and float16 on CPU
  // and CUDA); the other device's autocast state is left as it is.
  const at::DeviceType type = device_type_;
  const bool was_enabled = at::autocast::is_autocast_enabled(type);
  const at::ScalarType was_dtype = at::autocast::get_autocast_dtype(type);
  at::autocast::set_autocast_enabled(type, true);
  at::autocast::set_autocast_dtype(type, dtype_);
  at::autocast::increment_nesting();
  return ScopeGuard([type, was_enabled, was_dtype] {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type, was_enabled);
    at::autocast::set_autocast_dtype(type, was_dtype);
  });
}

bool Precision::optimizer_step(torch::optim::Optimizer& optimizer,
                               const torch::optim::Optimizer::LossClosure& closure, StepKernel kernel) const {
  run_optimizer_step(optimizer, closure, kernel);
  return true;
}

}  // namespace lightning::fabric
