#include "lightning/fabric/strategies/model_parallel.h"

#include <ATen/ATen.h>

#include <cmath>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/internal/gradient_norm.h"
#include "lightning/fabric/plugins/collectives/collective.h"
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
                                   std::pair{"tensor_parallel_size", options.tensor_parallel_size}}) {
    LF_CHECK(!size || *size > 0, ValueError, "ModelParallelOptions: ", name, "=", size.value_or(0),
             " must be positive, or unset.");
  }
  LF_CHECK(options.state_dict_type == "sharded" || options.state_dict_type == "full", ValueError,
           "ModelParallelOptions: state_dict_type=\"", options.state_dict_type,
           "\" is not valid. Choose \"sharded\" (a folder, every rank writes its slices) or \"full\" (one file).");
  const std::string name = options.data_parallel.name;
  ddp_strategy(options.data_parallel);  // checks the ddp settings
  return StrategySpec{name, [options](StrategyContext context) -> std::shared_ptr<Strategy> {
                        return std::make_shared<ModelParallelStrategy>(std::move(context), options);
                      }};
}

ModelParallelStrategy::ModelParallelStrategy(StrategyContext context, ModelParallelOptions options)
    : DDPStrategy(std::move(context), options.data_parallel), options_(std::move(options)) {}

ModelParallelStrategy::~ModelParallelStrategy() = default;

std::pair<int, int> ModelParallelStrategy::mesh_shape() const {
  const int world = world_size();
  int tensor = 0;
  if (options_.tensor_parallel_size) {
    tensor = *options_.tensor_parallel_size;
  } else if (options_.data_parallel_size) {
    tensor = world / *options_.data_parallel_size;
  } else {
    tensor = num_processes();
  }
  tensor = std::max(tensor, 1);
  return {options_.data_parallel_size.value_or(world / tensor), tensor};
}

void ModelParallelStrategy::setup_environment() {
  if (mesh_) return;
  DDPStrategy::setup_environment();
  const auto [data, tensor] = mesh_shape();
  mesh_ = std::make_shared<DeviceMesh>(collective(), data, tensor);
}

const std::shared_ptr<DeviceMesh>& ModelParallelStrategy::device_mesh() const {
  LF_CHECK(mesh_ != nullptr, RuntimeError, "The device mesh of strategy 'model_parallel' does not exist yet: call "
           "fabric.launch() (or any setup) first.");
  return mesh_;
}

std::shared_ptr<Collective> ModelParallelStrategy::data_parallel_group() { return device_mesh()->shared_data_group(); }

void ModelParallelStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  setup_environment();
  // Every tensor from global rank 0, before splitting: the tensors each tensor rank holds whole
  // agree within the tensor group, and each rank's slice is the slice of rank 0's tensor (as
  // Python's distribute_tensor takes shards from the mesh's first rank). The ddp setup below then
  // finds the data group equal already.
  if (world_size() > 1) broadcast_module_from_rank_zero(*module, {}, &collective());
  options_.parallelize(module, mesh_);
  for (const auto& split : tensor_parallel::sharded_parameters_of(*module)) {
    split_dims_[split.tensor.unsafeGetTensorImpl()] = split.dim;
  }
  DDPStrategy::setup_module(module);
}

Strategy::SamplerShare ModelParallelStrategy::sampler_share() const {
  const int tensor = mesh_shape().second;
  return {world_size() / tensor, global_rank() / tensor};
}

double ModelParallelStrategy::clip_gradients_by_norm(const std::vector<at::Tensor>& parameters, double max_norm,
                                                     double norm_type, bool error_if_nonfinite) {
  // A split parameter's parts are summed over the tensor group; a replicated one, whose gradient
  // every rank of the group holds whole, is counted once.
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> split_parameters, whole_parameters;
  for (const auto& parameter : parameters) {
    (split_dims_.count(parameter.unsafeGetTensorImpl()) ? split_parameters : whole_parameters).push_back(parameter);
  }
  std::vector<at::Tensor> split_grads = internal::gradients_of(split_parameters);
  at::Tensor part = internal::local_norm_part(split_grads, norm_type, root_device());
  const bool infinity = std::isinf(norm_type);
  if (mesh_->tensor_size() > 1) mesh_->tensor_group().all_reduce_(part, infinity ? ReduceOp::Max : ReduceOp::Sum);
  std::vector<at::Tensor> grads = internal::gradients_of(whole_parameters);
  const at::Tensor whole_part = internal::local_norm_part(grads, norm_type, root_device());
  part = infinity ? at::maximum(part, whole_part) : part + whole_part;
  grads.insert(grads.end(), split_grads.begin(), split_grads.end());
  return internal::clip_to_max_norm(grads, part, norm_type, max_norm, error_if_nonfinite);
}

}  // namespace lightning::fabric
