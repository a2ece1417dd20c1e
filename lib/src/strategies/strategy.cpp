#include "lightning/fabric/strategies/strategy.h"

#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cctype>

#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/strategies/ddp.h"
#include "lightning/fabric/strategies/dp.h"
#include "lightning/fabric/strategies/fsdp.h"
#include "lightning/fabric/utilities/rank_zero.h"

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

ScopeGuard Strategy::no_backward_sync(const torch::nn::Module& module, bool enabled) {
  (void)module;
  static bool warned = false;
  if (enabled && !warned) {
    warned = true;
    rank_zero_warn("fabric.no_backward_sync() has no effect with strategy '" + name() +
                   "': it has no gradient synchronisation to skip.");
  }
  return ScopeGuard();
}

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

void Strategy::save_checkpoint(const std::filesystem::path& path, const State& state, const StateFilter& filter) {
  std::string failure;
  if (is_global_zero()) {
    try {
      save_state_dict_file(path, to_checkpoint(state, filter));
    } catch (const c10::Error& error) {
      failure = error.what_without_backtrace();
    } catch (const std::exception& error) {
      failure = error.what();
    }
    if (failure.empty() && !std::filesystem::exists(path)) failure = "the file is missing after writing it";
  }
  // Every rank learns rank 0's outcome (this is also the barrier after the write).
  failure = broadcast_bytes(failure, 0);
  LF_CHECK(failure.empty(), RuntimeError, "fabric.save(", path.string(), ") failed on rank 0: ", failure);
}

StateDict Strategy::load_checkpoint(const std::filesystem::path& path, State* state, bool strict) {
  StateDict checkpoint = load_state_dict_file(path);
  return state ? restore_from_checkpoint(*state, checkpoint, strict) : checkpoint;
}

double Strategy::clip_gradients_by_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                                        bool error_if_nonfinite) {
  return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite);
}

const std::vector<torch::Device>& Strategy::data_parallel_devices() const {
  static const std::vector<torch::Device> none;
  return none;
}

StrategyRegistry& strategy_registry() {
  static StrategyRegistry registry = [] {
    StrategyRegistry built("strategy");
    built.add("single_device",
              [](StrategyContext context) { return std::make_shared<SingleDeviceStrategy>(std::move(context)); },
              "one process on one device");
    auto ddp = [](std::string name, bool find_unused) {
      DDPOptions options;
      options.name = std::move(name);
      options.find_unused_parameters = find_unused;
      return ddp_strategy(options).create;
    };
    built.add("ddp", ddp("ddp", false), "one process per device, gradients averaged after backward");
    built.add("ddp_spawn", ddp("ddp_spawn", false), "ddp; processes started by re-executing the program");
    built.add("ddp_find_unused_parameters_true", ddp("ddp_find_unused_parameters_true", true), "ddp, unused parameters allowed");
    built.add("ddp_find_unused_parameters_false", ddp("ddp_find_unused_parameters_false", false), "ddp");
    built.add("fsdp", fsdp_strategy().create, "parameters, gradients and optimizer state sharded over the ranks");
    built.add(
        "fsdp_cpu_offload",
        [](StrategyContext context) -> std::shared_ptr<Strategy> {
          // Offloading keeps shards and optimizer state in host memory: on CPU devices that is fsdp.
          for (const auto& device : context.parallel_devices) {
            LF_CHECK(!device.is_cuda(), ValueError, "strategy=\"fsdp_cpu_offload\" keeps shards in host memory ",
                     "and computes there; with CUDA devices (", device.str(), ") use strategy=\"fsdp\", which ",
                     "keeps the shards on the GPU, or accelerator=\"cpu\".");
          }
          return fsdp_strategy().create(std::move(context));
        },
        "fsdp with everything in host memory (CPU devices)");
    built.add("dp", [](StrategyContext context) { return std::make_shared<DataParallelStrategy>(std::move(context)); },
              "one process, each batch split over several CUDA devices");
    built.add(
        "ddp_fork",
        [](StrategyContext) -> std::shared_ptr<Strategy> {
          throw ValueError(
              "strategy=\"ddp_fork\" is not supported: forking a process after LibTorch has started its thread "
              "pools (intra-op, autograd, gloo) can deadlock the child. Use strategy=\"ddp\", which starts each "
              "process by re-executing the program.");
        },
        "refused: fork is unsafe with LibTorch's threads");
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
