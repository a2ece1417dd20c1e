// model_parallel's options and factory: the composed strategy (composed.h) over (replicate or
// shard, tensor).
#include "lightning/fabric/strategies/model_parallel.h"

#include "lightning/fabric/errors.h"
#include "lightning/fabric/strategies/composed.h"
#include "lightning/fabric/tensor_parallel/layers.h"

namespace lightning::fabric {

ModelParallelOptions::ModelParallelOptions() {
  parallelize = [](const std::shared_ptr<torch::nn::Module>& module, const std::shared_ptr<DeviceMesh>& mesh) {
    tensor_parallel::shard_tensor_parallel_layers(*module, mesh);
  };
  data_parallel.name = "model_parallel";
}

StrategySpec model_parallel_strategy(ModelParallelOptions options) {
  LF_CHECK(options.parallelize != nullptr, ValueError, "ModelParallelOptions: parallelize is empty. Give the function "
           "that applies tensor parallelism to the model, or keep the default (shard every tensor-parallel layer).");
  for (const auto& [name, size] : {std::pair{"data_parallel_size", options.data_parallel_size},
                                   std::pair{"tensor_parallel_size", options.tensor_parallel_size},
                                   std::pair{"data_parallel_shard_size", options.data_parallel_shard_size}}) {
    LF_CHECK(!size || *size > 0, ValueError, "ModelParallelOptions: ", name, "=", size.value_or(0),
             " must be positive, or unset.");
  }
  LF_CHECK(options.context_parallel_size > 0, ValueError, "ModelParallelOptions: context_parallel_size=",
           options.context_parallel_size, " must be positive (1: no context parallelism).");
  LF_CHECK(options.state_dict_type == "sharded" || options.state_dict_type == "full", ValueError,
           "ModelParallelOptions: state_dict_type=\"", options.state_dict_type,
           "\" is not valid. Choose \"sharded\" (a folder, every rank writes its parts) or \"full\" (one file).");
  LF_CHECK(options.data_parallel_strategy == "ddp" || options.data_parallel_strategy == "fsdp", ValueError,
           "ModelParallelOptions: data_parallel_strategy=\"", options.data_parallel_strategy, "\" is not valid. Choose "
           "\"ddp\" (every data replica holds its tensor-parallel slices whole) or \"fsdp\" (the slices are sharded "
           "again over the data group).");
  LF_CHECK(!options.data_parallel_shard_size || (options.data_parallel_strategy == "fsdp" &&
                                                 options.fully_sharded.sharding_strategy == ShardingStrategy::HybridShard),
           ValueError, "ModelParallelOptions: data_parallel_shard_size=", options.data_parallel_shard_size.value_or(0),
           " splits the data dimension into replicas of shards, which only fsdp's HYBRID_SHARD does (now "
           "data_parallel_strategy=\"", options.data_parallel_strategy, "\" with ",
           to_string(options.fully_sharded.sharding_strategy), "). Set data_parallel_strategy \"fsdp\" and "
           "fully_sharded.sharding_strategy HYBRID_SHARD, or leave data_parallel_shard_size unset.");
  if (options.data_parallel_strategy == "ddp") {
    ddp_strategy(options.data_parallel);  // checks the ddp settings
  } else {
    options.fully_sharded.state_dict_type = options.state_dict_type;
    fsdp_strategy(options.fully_sharded);  // checks the fsdp settings
  }
  return StrategySpec{options.data_parallel.name, [options](StrategyContext context) -> std::shared_ptr<Strategy> {
                        return std::make_shared<ComposedStrategy>(std::move(context), options);
                      }};
}

}  // namespace lightning::fabric
