// Every built-in accelerator, precision plugin and strategy, registered the first time its
// registry is used. The one file a new built-in touches besides its own (docs/decisions.md,
// "Adding a strategy"); every list of names in messages and --help comes from these registries.
#include "lightning/fabric/accelerators/accelerator.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/precision/precision.h"
#include "lightning/fabric/strategies/ddp.h"
#include "lightning/fabric/strategies/dp.h"
#include "lightning/fabric/strategies/fsdp.h"
#include "lightning/fabric/strategies/model_parallel.h"
#include "lightning/fabric/strategies/pipeline.h"

namespace lightning::fabric {

AcceleratorRegistry& accelerator_registry() {
  static AcceleratorRegistry registry = [] {
    AcceleratorRegistry built("accelerator");
    built.add("cpu", [] { return std::make_shared<CPUAccelerator>(); }, "CPU processes");
    built.add("cuda", [] { return std::make_shared<CUDAAccelerator>(); }, "NVIDIA GPUs through CUDA");
    return built;
  }();
  return registry;
}

PrecisionRegistry& precision_registry() {
  static PrecisionRegistry registry = [] {
    PrecisionRegistry built("precision");
    built.add("64-true", [] { return std::make_shared<DoublePrecision>(); }, "float64 everywhere");
    built.add("32-true", [] { return std::make_shared<Precision>(); }, "float32 everywhere");
    built.add("16-mixed",
              [] { return std::make_shared<MixedPrecision>("16-mixed", torch::kFloat16, std::make_shared<LossScaler>()); },
              "float32 parameters, float16 autocast in the forward, dynamic loss scaling (CUDA)");
    built.add("bf16-mixed", [] { return std::make_shared<MixedPrecision>("bf16-mixed", torch::kBFloat16); },
              "float32 parameters, bfloat16 autocast in the forward");
    built.add("16-true", [] { return std::make_shared<TruePrecision>("16-true", torch::kFloat16); }, "float16 everywhere");
    built.add("bf16-true", [] { return std::make_shared<TruePrecision>("bf16-true", torch::kBFloat16); }, "bfloat16 everywhere");
    return built;
  }();
  return registry;
}

std::vector<std::string> precision_choices() {
  std::vector<std::string> choices = precision_registry().names();
  for (const char* alias : {"64", "32", "16", "bf16"}) choices.emplace_back(alias);
  return choices;
}

namespace {
StrategyRegistry::Factory ddp_named(std::string name, bool find_unused_parameters) {
  DDPOptions options;
  options.name = std::move(name);
  options.find_unused_parameters = find_unused_parameters;
  return ddp_strategy(options).create;
}

std::shared_ptr<Strategy> fsdp_cpu_offload(StrategyContext context) {
  // Offloading keeps shards and optimizer state in host memory: on CPU devices that is fsdp.
  for (const auto& device : context.parallel_devices) {
    LF_CHECK(!device.is_cuda(), ValueError, "strategy=\"fsdp_cpu_offload\" keeps shards in host memory ",
             "and computes there; with CUDA devices (", device.str(), ") use strategy=\"fsdp\", which ",
             "keeps the shards on the GPU, or accelerator=\"cpu\".");
  }
  return fsdp_strategy().create(std::move(context));
}

}  // namespace

StrategyRegistry& strategy_registry() {
  static StrategyRegistry registry = [] {
    StrategyRegistry built("strategy");
    built.add("single_device",
              [](StrategyContext context) { return std::make_shared<SingleDeviceStrategy>(std::move(context)); },
              "one process on one device");
    built.add("ddp", ddp_named("ddp", false), "one process per device, gradients averaged after backward");
    built.add("ddp_spawn", ddp_named("ddp_spawn", false), "ddp; processes started by re-executing the program");
    built.add("ddp_find_unused_parameters_true", ddp_named("ddp_find_unused_parameters_true", true),
              "ddp, unused parameters allowed");
    built.add("ddp_find_unused_parameters_false", ddp_named("ddp_find_unused_parameters_false", false), "ddp");
    built.add("dp", [](StrategyContext context) { return std::make_shared<DataParallelStrategy>(std::move(context)); },
              "one process, each batch split over several CUDA devices");
    built.add("fsdp", fsdp_strategy().create, "parameters, gradients and optimizer state sharded over the ranks");
    built.add("fsdp_cpu_offload", fsdp_cpu_offload, "fsdp with everything in host memory (CPU devices)");
    built.add("model_parallel", model_parallel_strategy().create,
              "tensor parallelism inside groups of ranks, ddp across the groups (a 2-D device mesh)");
    built.add("pipeline", pipeline_strategy().create,
              "an lf::Pipeline's layers in stages across the ranks, micro-batches under a schedule, ddp across pipelines");
    return built;
  }();
  return registry;
}

std::vector<std::string> strategy_choices() {
  std::vector<std::string> choices = {"auto"};
  for (const auto& name : strategy_registry().names()) choices.push_back(name);
  return choices;
}

}  // namespace lightning::fabric
