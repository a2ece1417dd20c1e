// The composed strategy's tensor part (composed.h): the mesh shape model_parallel's options ask
// for, parallelize, the parameters it split, and each split parameter's factor of its placement
// in checkpoints. Private to the library; one per strategy.
#pragma once

#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lightning/fabric/checkpoint/placement.h"
#include "lightning/fabric/strategies/model_parallel.h"

namespace lightning::fabric {

class TensorParallelPlan {
 public:
  explicit TensorParallelPlan(ModelParallelOptions options) : options_(std::move(options)) {}
  const ModelParallelOptions& options() const { return options_; }

  /// (data, tensor) sizes from model_parallel's options, for this world size and workers per node.
  std::pair<int, int> mesh_shape(int world_size, int per_node) const;
  /// The mesh parallelize receives (it has "tensor"); RuntimeError before use_mesh.
  void use_mesh(std::shared_ptr<DeviceMesh> mesh) { mesh_ = std::move(mesh); }
  bool has_mesh() const { return mesh_ != nullptr; }
  const std::shared_ptr<DeviceMesh>& mesh() const;

  /// options.parallelize(module, mesh), then notes the split parameters it made (their identity
  /// is stable).
  void parallelize(const std::shared_ptr<torch::nn::Module>& module);
  /// The dimension a parameter (as the module holds it) is split along, or nullopt.
  std::optional<int64_t> split_dim(const at::Tensor& parameter) const;
  /// Where a split parameter's value, of `shape` (this rank's slice), lies in its whole tensor:
  /// this rank's box along its split dimension (writes: true); nullopt for a whole parameter.
  std::optional<Placement> split_placement(const at::Tensor& parameter, const std::vector<int64_t>& shape) const;

 private:
  ModelParallelOptions options_;
  std::shared_ptr<DeviceMesh> mesh_;
  std::unordered_map<const c10::TensorImpl*, int64_t> split_dims_;
};

}  // namespace lightning::fabric
