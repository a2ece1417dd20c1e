// The model_parallel strategy: tensor parallelism inside each group of tensor_parallel_size
// ranks and data parallelism (ddp) across those groups, on a 2-D DeviceMesh (data x tensor), as
// Python Lightning's ModelParallelStrategy (docs/model-parallel.md).
//
//   lf::ModelParallelOptions mp;
//   mp.tensor_parallel_size = 2;                 // default: the devices per node
//   mp.parallelize = [](const auto& module, const auto& mesh) { ... };  // default: shard every
//                                                // tensor-parallel layer (tensor_parallel/layers.h)
//   lf::Fabric fabric(lf::FabricOptions().strategy(lf::model_parallel_strategy(mp)));
//
// At setup the strategy builds the mesh, broadcasts rank 0's whole model to every rank, calls
// parallelize(module, mesh) once per set-up module (so every slice is a slice of rank 0's tensor
// and every unsplit tensor agrees within its tensor group), and averages gradients over the data
// group during fabric.backward (bucketed and overlapped, as ddp). The sampler splits data by the
// data rank: the ranks of a tensor group read the same batches. clip_gradients counts a split
// parameter's parts once each and a replicated parameter once. fabric.save writes a distributed
// checkpoint folder (each split tensor as its slices, Python's torch.distributed.checkpoint
// layout) or, with state_dict_type "full", one file with every tensor whole; fabric.load reads
// either under any mesh shape.
#pragma once

#include "lightning/fabric/export.h"

#include <functional>
#include <memory>
#include <map>
#include <optional>
#include <unordered_map>

#include "lightning/fabric/strategies/ddp.h"
#include "lightning/fabric/strategies/device_mesh.h"

namespace lightning::fabric {

namespace dcp {
struct Box;  // a box of a tensor in a distributed checkpoint (private to the library)
}

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
  /// The data dimension's ddp: buckets, process group, activation checkpointing. Its name is
  /// what the strategy reports ("model_parallel").
  DDPOptions data_parallel;
  /// "sharded": fabric.save writes a folder in which every rank writes its slices (Python's
  /// save_distributed_checkpoint=True). "full": each split tensor is gathered and rank 0 writes
  /// one file of whole tensors, which any strategy (and Python's torch.load) reads.
  std::string state_dict_type = "sharded";
};

/// For FabricOptions().strategy(...). ValueError for non-positive sizes, an empty parallelize, a
/// bad state_dict_type or invalid ddp settings.
LF_API StrategySpec model_parallel_strategy(ModelParallelOptions options = ModelParallelOptions());

class LF_API ModelParallelStrategy : public DDPStrategy {
 public:
  ModelParallelStrategy(StrategyContext context, ModelParallelOptions options);
  ~ModelParallelStrategy() override;

  /// Forms the process group and the mesh (once; collective). ValueError when the sizes do not
  /// make the world size.
  void setup_environment() override;
  /// The mesh (after setup_environment; RuntimeError before).
  const std::shared_ptr<DeviceMesh>& device_mesh() const;
  void setup_module(const std::shared_ptr<torch::nn::Module>& module) override;
  double clip_gradients_by_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                                bool error_if_nonfinite) override;
  SamplerShare sampler_share() const override;
  /// Reads a file of whole tensors or a folder (from any mesh shape, or from fsdp or Python) and
  /// keeps this rank's slice of every split tensor (collective).
  StateDict load_checkpoint(const std::filesystem::path& path, State* state, bool strict) override;

 protected:
  std::shared_ptr<Collective> data_parallel_group() override;
  CheckpointWrite prepare_checkpoint(const std::string& call, const std::filesystem::path& path, const State& state,
                                     const StateFilter& filter, bool host_copy) override;

 private:
  /// (data, tensor) from the options and the world size.
  std::pair<int, int> mesh_shape() const;
  /// A split tensor of a checkpoint: the dimension it is split along and its whole shape.
  struct SplitSlot {
    int64_t dim = 0;
    std::vector<int64_t> full_shape;
  };
  /// The split tensors of `local` (this rank's to_checkpoint of state) by slash path: module
  /// parameters as "key/name", optimizer state as "key/state/<index>/<field>".
  std::map<std::string, SplitSlot> split_slots(const State& state, const StateDict& local) const;
  /// The slot of a split parameter, or nullopt for a whole one.
  std::optional<SplitSlot> split_slot_of(const at::Tensor& parameter) const;
  std::vector<dcp::SaveItem> sharded_save_items(const State& state, const StateDict& local,
                                                const std::map<std::string, SplitSlot>& slots, StateDict& rest);
  StateDict read_file(const std::filesystem::path& path, State* state, bool strict);
  StateDict read_folder(const std::filesystem::path& path, State* state, bool strict);
  /// RuntimeError naming `what` and the shapes unless `saved` is slot's whole shape.
  void check_whole_shape(c10::IntArrayRef saved, const SplitSlot& slot, const std::string& what) const;
  /// This rank's box of slot's whole tensor.
  dcp::Box slice_box(const SplitSlot& slot) const;
  /// This rank's slice of the whole tensor `full` of slot (check_whole_shape first).
  at::Tensor slice_of(const at::Tensor& full, const SplitSlot& slot, const std::string& what) const;
  ModelParallelOptions options_;
  std::shared_ptr<DeviceMesh> mesh_;
  /// The split parameters of every set-up module and their split dimension, found once at setup
  /// (their identity is stable).
  std::unordered_map<const c10::TensorImpl*, int64_t> split_dims_;
};

}  // namespace lightning::fabric
