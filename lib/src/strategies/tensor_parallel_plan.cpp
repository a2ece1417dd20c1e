#include "lightning/fabric/strategies/tensor_parallel_plan.h"

#include <ATen/ATen.h>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/tensor_parallel/layers.h"

namespace lightning::fabric {

std::pair<int, int> TensorParallelPlan::mesh_shape(int world_size, int per_node) const {
  int tensor = 0;
  if (options_.tensor_parallel_size) {
    tensor = *options_.tensor_parallel_size;
  } else if (options_.data_parallel_size) {
    tensor = world_size / *options_.data_parallel_size;
  } else {
    tensor = per_node;
  }
  tensor = std::max(tensor, 1);
  return {options_.data_parallel_size.value_or(world_size / tensor), tensor};
}

const std::shared_ptr<DeviceMesh>& TensorParallelPlan::mesh() const {
  LF_CHECK(mesh_ != nullptr, RuntimeError, "The device mesh of strategy 'model_parallel' does not exist yet: call "
           "fabric.launch() (or any setup) first.");
  return mesh_;
}

void TensorParallelPlan::parallelize(const std::shared_ptr<torch::nn::Module>& module) {
  options_.parallelize(module, mesh());
  for (const auto& split : tensor_parallel::sharded_parameters_of(*module)) {
    split_dims_[split.tensor.unsafeGetTensorImpl()] = split.dim;
  }
}

std::optional<int64_t> TensorParallelPlan::split_dim(const at::Tensor& parameter) const {
  auto found = split_dims_.find(parameter.unsafeGetTensorImpl());
  if (found == split_dims_.end()) return std::nullopt;
  return found->second;
}

std::optional<Placement> TensorParallelPlan::split_placement(const at::Tensor& parameter,
                                                            const std::vector<int64_t>& shape) const {
  const auto dim = split_dim(parameter);
  if (!dim) return std::nullopt;
  const size_t d = static_cast<size_t>(*dim);
  Placement placement = Placement::whole(shape);
  placement.global_shape[d] *= mesh_->size("tensor");
  placement.box.offsets[d] = mesh_->coordinate("tensor") * placement.box.sizes[d];
  return placement;
}

}  // namespace lightning::fabric
