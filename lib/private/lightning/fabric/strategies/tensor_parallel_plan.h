// What both model_parallel strategies share, whatever runs on the data dimension (ddp:
// ModelParallelStrategy, fsdp: FSDPModelParallelStrategy): the mesh, parallelize and the split
// parameters it made, the gradient norm over split and whole parameters, and each split
// parameter's placement in checkpoints. Private to the library; one per strategy.
#pragma once

#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lightning/fabric/checkpoint/sharded_checkpoint.h"
#include "lightning/fabric/strategies/model_parallel.h"

namespace lightning::fabric {

class Collective;

class TensorParallelPlan : public CheckpointLayout {
 public:
  explicit TensorParallelPlan(ModelParallelOptions options) : options_(std::move(options)) {}
  const ModelParallelOptions& options() const { return options_; }

  /// (data, tensor) sizes from the options, for this world size and workers per node.
  std::pair<int, int> mesh_shape(int world_size, int per_node) const;
  /// Forms the mesh once (collective over world): (replicate or shard, tensor), the first
  /// flattened as "data" too. ValueError when the sizes do not make the world.
  void form_mesh(Collective& world, int per_node);
  /// Uses a mesh formed elsewhere (the pipeline's), which has "tensor" and "data".
  void use_mesh(std::shared_ptr<DeviceMesh> mesh);
  bool has_mesh() const { return mesh_ != nullptr; }
  /// RuntimeError before form_mesh.
  const std::shared_ptr<DeviceMesh>& mesh() const;

  /// options.parallelize(module, mesh), then notes the split parameters it made (their identity
  /// is stable).
  void parallelize(const std::shared_ptr<torch::nn::Module>& module);
  /// The dimension a parameter (as the module holds it) is split along, or nullopt.
  std::optional<int64_t> split_dim(const at::Tensor& parameter) const;
  /// Where a split parameter's value, of `shape` (this rank's slice), lies in its whole tensor:
  /// this rank's box along its split dimension (writes: true); nullopt for a whole parameter.
  std::optional<Placement> split_placement(const at::Tensor& parameter, const std::vector<int64_t>& shape) const;

  /// ddp on the data dimension: split_placement, written by data rank 0 (the others hold replicas).
  std::optional<Placement> placement(const at::Tensor& parameter) const override;

  /// Clips gradients whose norm parts are summed (or maxed) over each group of split_over for
  /// `split` and of whole_over for `whole` (none: this rank's part is the whole norm); returns the norm.
  static double clip(const std::vector<at::Tensor>& split, const std::vector<at::Tensor>& whole,
                     const std::vector<Collective*>& split_over, const std::vector<Collective*>& whole_over,
                     double max_norm, double norm_type, bool error_if_nonfinite, at::Device device);

 private:
  ModelParallelOptions options_;
  std::shared_ptr<DeviceMesh> mesh_;
  std::unordered_map<const c10::TensorImpl*, int64_t> split_dims_;
};

}  // namespace lightning::fabric
