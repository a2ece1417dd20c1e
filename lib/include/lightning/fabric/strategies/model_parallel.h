// The model_parallel strategy: tensor parallelism inside each group of tensor_parallel_size
// ranks and data parallelism across those groups, on a DeviceMesh ("replicate" under ddp or
// "shard" under fsdp, flattened as "data" too; then "tensor"), as Python Lightning's
// ModelParallelStrategy (docs/model-parallel.md); optionally context parallelism between them
// ("context": each sequence split over context_parallel_size ranks).
//
//   lf::ModelParallelOptions mp;
//   mp.tensor_parallel_size = 2;                 // default: the devices per node
//   mp.parallelize = [](const auto& module, const auto& mesh) { ... };  // default: shard every
//                                                // tensor-parallel layer (tensor_parallel/layers.h)
//   mp.data_parallel_strategy = "fsdp";          // default "ddp"
//   lf::Fabric fabric(lf::FabricOptions().strategy(lf::model_parallel_strategy(mp)));
//
// The data dimension runs ddp (every data replica holds its tensor-parallel slices whole,
// gradients averaged over the data group) or fsdp (what Python builds with fully_shard over the
// data dimension: each tensor-parallel slice is sharded again across the data group, gradients
// reduce-scattered over it, optimizer state sharded). One strategy class serves both, and the
// pipeline: ComposedStrategy (composed.h).
// At setup the strategy builds the mesh, broadcasts rank 0's whole model to every rank, calls
// parallelize(module, mesh) once per set-up module (so every slice is a slice of rank 0's tensor
// and every unsplit tensor agrees within its tensor group), then sets the module up for the data
// dimension. The sampler splits data by the data rank: the ranks of a tensor group read the same
// batches. clip_gradients counts every element once. fabric.save writes a distributed checkpoint
// folder (Python's torch.distributed.checkpoint layout, each rank its parts) or, with
// state_dict_type "full", one file with every tensor whole; fabric.load reads either under any mesh
// shape and either data dimension, and checkpoints of fsdp or Python.
#pragma once

#include "lightning/fabric/export.h"

#include <functional>
#include <memory>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "lightning/fabric/strategies/ddp.h"
#include "lightning/fabric/strategies/device_mesh.h"
#include "lightning/fabric/strategies/fsdp.h"

namespace lightning::fabric {

struct LF_API ModelParallelOptions {
  ModelParallelOptions();
  /// Applies tensor parallelism to module in place (Python's parallelize_fn), e.g. by sharding
  /// its tensor-parallel layers over mesh. Called once per set-up module, on every rank. Default:
  /// tensor_parallel::shard_tensor_parallel_layers.
  std::function<void(const std::shared_ptr<torch::nn::Module>& module, const std::shared_ptr<DeviceMesh>& mesh)>
      parallelize;
  /// Unset: world size / tensor_parallel_size.
  std::optional<int> data_parallel_size;
  /// Unset: world size / data_parallel_size when that is set, else the devices per node (Python's "auto").
  std::optional<int> tensor_parallel_size;
  /// Under HYBRID_SHARD: the ranks of the data dimension that shard one replica (the mesh's
  /// "shard" size; it must divide the data size). Unset: the devices per node /
  /// tensor_parallel_size (at least 1), as fsdp's HYBRID_SHARD shards within a node.
  std::optional<int> data_parallel_shard_size;
  /// Context parallelism: the ranks that split each sequence between them (the mesh's "context"
  /// dimension, between the data dimensions and "tensor"; none when 1). They read the same
  /// samples, each attends its part of the sequence by ring attention
  /// (context_parallel/attention.h), and gradients are averaged over data x context (fsdp shards
  /// over shard x context). The world size is data x context x tensor.
  int context_parallel_size = 1;
  /// What runs on the data dimension: "ddp" (the mesh's "replicate" dimension) or "fsdp" ("shard").
  std::string data_parallel_strategy = "ddp";
  /// The data dimension's ddp ("ddp"): buckets, process group, activation checkpointing. Its name
  /// is what the strategy reports ("model_parallel") under either data dimension.
  DDPOptions data_parallel;
  /// The data dimension's fsdp ("fsdp"): sharding strategy, units, mixed precision, prefetch,
  /// activation checkpointing, process group. Its state_dict_type is not used: state_dict_type
  /// below decides for both. HYBRID_SHARD (HSDP x tensor) splits the data dimension in two: the
  /// mesh is (replicate, shard, tensor), each replica's parameters sharded over the shard
  /// dimension and its gradients averaged over the replicate one.
  FSDPOptions fully_sharded;
  /// "sharded": fabric.save writes a folder in which every rank writes its slices (Python's
  /// save_distributed_checkpoint=True). "full": each split tensor is gathered and rank 0 writes
  /// one file of whole tensors, which any strategy (and Python's torch.load) reads.
  std::string state_dict_type = "sharded";
};

/// For FabricOptions().strategy(...). ValueError for non-positive sizes, an empty parallelize, a
/// bad state_dict_type or data_parallel_strategy, data_parallel_shard_size without HYBRID_SHARD,
/// or invalid ddp or fsdp settings.
LF_API StrategySpec model_parallel_strategy(ModelParallelOptions options = ModelParallelOptions());

/// What the mesh-based strategy offers (ComposedStrategy, composed.h), whatever runs on the data
/// dimension: fabric.strategy_as<lf::MeshStrategy>().device_mesh().
class LF_API MeshStrategy {
 public:
  virtual ~MeshStrategy() = default;
  /// The mesh (after setup_environment; RuntimeError before).
  virtual const std::shared_ptr<DeviceMesh>& device_mesh() const = 0;
};

}  // namespace lightning::fabric
