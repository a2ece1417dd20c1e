#include "lightning/fabric/strategies/tensor_parallel_plan.h"

#include <ATen/ATen.h>
#include <torch/types.h>

#include <cmath>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/internal/gradient_norm.h"
#include "lightning/fabric/plugins/collectives/collective.h"
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

void TensorParallelPlan::form_mesh(Collective& world, int per_node) {
  if (mesh_) return;
  const auto [data, tensor] = mesh_shape(world.world_size(), per_node);
  const std::string data_dimension = options_.data_parallel_strategy == "fsdp" ? "shard" : "replicate";
  auto mesh = std::make_shared<DeviceMesh>(world, std::vector<MeshDimension>{{data_dimension, data}, {"tensor", tensor}});
  mesh->flatten({data_dimension}, "data");
  use_mesh(std::move(mesh));
}

void TensorParallelPlan::use_mesh(std::shared_ptr<DeviceMesh> mesh) { mesh_ = std::move(mesh); }

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

std::optional<Placement> TensorParallelPlan::placement(const at::Tensor& parameter) const {
  auto placement = split_placement(parameter, parameter.sizes().vec());
  if (placement) placement->writes = mesh_->coordinate("data") == 0;
  return placement;
}

double TensorParallelPlan::clip(const std::vector<at::Tensor>& split, const std::vector<at::Tensor>& whole,
                                const std::vector<Collective*>& split_over, const std::vector<Collective*>& whole_over,
                                double max_norm, double norm_type, bool error_if_nonfinite, at::Device device) {
  torch::NoGradGuard no_grad;
  const ReduceOp op = std::isinf(norm_type) ? ReduceOp::Max : ReduceOp::Sum;
  std::vector<at::Tensor> split_grads = internal::gradients_of(split);
  at::Tensor part = internal::local_norm_part(split_grads, norm_type, device);
  for (Collective* group : split_over) {
    if (group->world_size() > 1) group->all_reduce_(part, op);
  }
  std::vector<at::Tensor> grads = internal::gradients_of(whole);
  at::Tensor whole_part = internal::local_norm_part(grads, norm_type, device);
  for (Collective* group : whole_over) {
    if (group->world_size() > 1) group->all_reduce_(whole_part, op);
  }
  part = op == ReduceOp::Max ? at::maximum(part, whole_part) : part + whole_part;
  grads.insert(grads.end(), split_grads.begin(), split_grads.end());
  return internal::clip_to_max_norm(grads, part, norm_type, max_norm, error_if_nonfinite);
}

}  // namespace lightning::fabric
