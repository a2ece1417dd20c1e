#include "lightning/fabric/strategies/strategy.h"

#include <algorithm>
#include <cctype>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

ReduceOp parse_reduce_op(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "sum") return ReduceOp::Sum;
  if (lower == "mean" || lower == "avg") return ReduceOp::Mean;
  if (lower == "max") return ReduceOp::Max;
  if (lower == "min") return ReduceOp::Min;
  if (lower == "product" || lower == "prod") return ReduceOp::Product;
  throw ValueError("reduce_op=\"" + name + "\" is not supported. Choose one of: sum, mean (avg), max, min, product.");
}

void Strategy::setup_environment() { context_.accelerator->setup_device(root_device()); }

void Strategy::module_to_device(torch::nn::Module& module) const { module.to(root_device()); }

void Strategy::backward(at::Tensor& loss, torch::nn::Module* module) {
  (void)module;
  const Precision& precision = *context_.precision;
  precision.pre_backward(loss);
  precision.backward(loss);
  precision.post_backward(loss);
}

bool Strategy::optimizer_step(torch::optim::Optimizer& optimizer,
                              const torch::optim::Optimizer::LossClosure& closure) {
  return context_.precision->optimizer_step(optimizer, closure);
}

SingleDeviceStrategy::SingleDeviceStrategy(StrategyContext context) : Strategy(std::move(context)) {
  LF_CHECK(context_.parallel_devices.size() == 1, ValueError, "strategy=\"single_device\" runs one process on one ",
           "device, but ", context_.parallel_devices.size(), " devices were selected. Use devices=1, or a ",
           "distributed strategy such as \"ddp\".");
}

StrategyRegistry& strategy_registry() {
  static StrategyRegistry registry = [] {
    StrategyRegistry built("strategy");
    built.add("single_device",
              [](StrategyContext context) { return std::make_shared<SingleDeviceStrategy>(std::move(context)); },
              "one process on one device");
    return built;
  }();
  return registry;
}

const std::vector<std::string>& strategy_choices() {
  static const std::vector<std::string> choices = {
      "auto", "single_device", "ddp", "ddp_spawn", "ddp_fork", "ddp_find_unused_parameters_true",
      "ddp_find_unused_parameters_false", "dp", "fsdp", "fsdp_cpu_offload"};
  return choices;
}

}  // namespace lightning::fabric
