#include "lightning/fabric/plugins/precision/precision.h"

#include <torch/types.h>

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

void Precision::backward(at::Tensor& loss) const { loss.backward(); }

bool Precision::optimizer_step(torch::optim::Optimizer& optimizer,
                               const torch::optim::Optimizer::LossClosure& closure) const {
  optimizer.step(closure);
  return true;
}

PrecisionRegistry& precision_registry() {
  static PrecisionRegistry registry = [] {
    PrecisionRegistry built("precision");
    built.add("32-true", [] { return std::make_shared<Precision>(); }, "float32 everywhere");
    built.add("64-true", [] { return std::make_shared<DoublePrecision>(); }, "float64 everywhere");
    return built;
  }();
  return registry;
}

const std::vector<std::string>& precision_choices() {
  static const std::vector<std::string> choices = {"64-true", "32-true", "16-mixed", "bf16-mixed", "16-true",
                                                   "bf16-true", "64",     "32",       "16",         "bf16"};
  return choices;
}

}  // namespace lightning::fabric
