// The composed strategy: every parallelism but plain ddp and fsdp, built from one description.
// It holds one DeviceMesh (device_mesh.h) whose dimensions are named "pipe", "replicate", "shard",
// "context" and "tensor" (in that order, those the configuration uses) and one part per dimension:
//   - data: the ddp strategy on "replicate" (its bucketed reducer and buffer broadcast), the fsdp
//     strategy on "shard" (its sharding engine), or fsdp on both (HYBRID_SHARD: shards within
//     "shard", averaged over "replicate"), run over the mesh's groups (DataGroups);
//   - context: the data part's groups widened by "context" (gradients averaged over data x
//     context, fsdp sharding over shard x context); the sequence split and ring attention are the
//     model's calls (context_parallel/attention.h) over the mesh's "context" group;
//   - tensor: the tensor-parallel plan (parallelize, and which parameters it split);
//   - pipe: the pipeline plan (which stages this rank keeps, the schedule's executor).
// Each part contributes its setup step, its refusals and its factor of each tensor's placement;
// one function (placements()) composes a tensor's placement (where its value lies in the whole
// tensor and which rank writes it), which the checkpoint engine, gradient clipping and lf::EMA
// read.
// It is registered as "model_parallel" (model_parallel_strategy: (replicate or shard, [context,]
// tensor), or (replicate, shard, [context,] tensor) under HYBRID_SHARD) and
// "pipeline" (pipeline_strategy: (pipe, replicate or shard, tensor)); docs/model-parallel.md.
#pragma once

#include "lightning/fabric/export.h"

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lightning/fabric/strategies/device_mesh.h"
#include "lightning/fabric/strategies/model_parallel.h"
#include "lightning/fabric/strategies/parallel.h"
#include "lightning/fabric/strategies/pipeline.h"

namespace lightning::fabric {

class FSDPStrategy;
class PipelinePlan;        // the pipe part (private to the library)
class TensorParallelPlan;  // the tensor part (private to the library)

class LF_API ComposedStrategy : public ParallelStrategy, public PipelineParallel {
 public:
  /// model_parallel: (replicate, tensor) under ddp, (shard, tensor) under fsdp.
  ComposedStrategy(StrategyContext context, ModelParallelOptions options);
  /// pipeline: (pipe, replicate or shard, tensor).
  ComposedStrategy(StrategyContext context, PipelineOptions options);
  ~ComposedStrategy() override;
  std::string name() const override;

  /// Forms the process group, the mesh and its groups, and puts the data part on them (once;
  /// collective). ValueError when the sizes do not make the world size.
  void setup_environment() override;
  /// The mesh (after setup_environment; RuntimeError before).
  const std::shared_ptr<DeviceMesh>& device_mesh() const override;
  /// The pipe dimension's size and this rank's coordinate on it (1 and 0 without one), this
  /// rank's stages, and the last step's timing (zeros without a pipe dimension).
  int pipe_size() const override;
  int pipe_rank() const override;
  std::vector<int> local_stages() const override;
  PipelineStepStats last_step() const override;
  /// The ddp or fsdp strategy running on the mesh's data dimensions.
  Strategy* data_parallel_part() const override;
  /// Over the world and every group of the mesh (the data part's among them) and the pipe's.
  uint64_t operation_count() const override;

  /// True: fabric.init_module(true) builds on the meta device under every configuration.
  bool builds_on_meta_device() const override;
  /// Keeps only this rank's stages (pipe), runs parallelize on the meta model to learn which
  /// parameters it splits, then materialises each parameter's full value one at a time (rank 0's
  /// build replayed on every rank), cut to this rank's tensor-parallel slice, of which fsdp keeps
  /// its shard: no rank holds more than one full parameter beyond its own part.
  void materialize_meta_tensors(torch::nn::Module& module) override;
  void module_to_device(torch::nn::Module& module) const override;
  /// The parts' setup steps in order: pipe (keep this rank's stages; refusals), tensor (rank 0's
  /// values over the ranks that split them, then parallelize), data (ddp's reducer, or fsdp's
  /// shards), pipe again (the schedule's executor).
  void setup_module(const std::shared_ptr<torch::nn::Module>& module) override;
  /// Drops other stages' parameters from the optimizer's groups, then the data part's step (fsdp:
  /// the optimizer steps shards).
  void setup_optimizer(torch::optim::Optimizer& optimizer) override;
  ModulePolicy activation_checkpointing() const override;
  ScopeGuard no_backward_sync(const torch::nn::Module& module, bool enabled) override;
  void backward(at::Tensor& loss, torch::nn::Module* module, const BackwardOptions& options) override;
  void before_grad(bool create_graph) override;
  bool optimizer_step(torch::optim::Optimizer& optimizer, const torch::optim::Optimizer::LossClosure& closure = nullptr,
                      StepKernel kernel = StepKernel::LibTorch) override;
  void before_forward(const torch::nn::Module& module) override;
  at::Tensor convert_input(const at::Tensor& input) const override;
  void annotate_forward_error(const torch::nn::Module& module, const std::exception& error) override;
  std::vector<std::pair<std::string, at::Tensor>> trained_tensors(const torch::nn::Module& module) override;
  void trained_tensors_changed() override;
  /// The composed placement: fsdp's flat range (shard part) of this rank's tensor-parallel slice
  /// (tensor part), written by the first replica over the data (and context) dimensions and by
  /// the first tensor rank of what the tensor part does not split; under the pipe part each
  /// stage's tensors are placed whole on that stage's ranks. Read by the checkpoint engine,
  /// gradient clipping (each element once: every rank's written parts summed over the world, what
  /// has no placement counted on each rank) and trained_parts (lf::EMA; ValueError under the
  /// pipeline, where each stage's tensors live on its ranks only).
  CheckpointLayout* placements() override;
  /// The data dimensions' share: ranks of one model replica (its pipe and tensor peers) read the
  /// same samples; data ranks different ones.
  SamplerShare sampler_share() const override;
  /// Reads a folder or file written under any mesh shape, ddp or fsdp, or by Python (collective).
  StateDict load_checkpoint(const std::filesystem::path& path, State* state, bool strict) override;

 protected:
  /// A folder (torch.distributed.checkpoint's layout, each part written by one rank), or under
  /// model_parallel with state_dict_type "full" one file of whole tensors.
  CheckpointWrite prepare_checkpoint(const std::string& call, const std::filesystem::path& path, const State& state,
                                     const StateFilter& filter, bool host_copy) override;

 private:
  class Layout;  // the composed placement, as the checkpoint engine asks it
  /// The mesh's dimensions for this world size, outermost first (no mesh needed).
  std::vector<MeshDimension> dimensions() const;
  /// The data dimensions: "replicate" (ddp), "shard" (fsdp), or both (fsdp's HYBRID_SHARD).
  std::vector<std::string> data_dimensions() const;
  /// The group of ranks holding the same model part: "data", or "data_context" with a context
  /// dimension (its gradients averaged over both).
  std::string replicas() const;
  bool fully_sharded() const { return options_.data_parallel_strategy == "fsdp"; }
  bool hybrid() const;
  FSDPStrategy* fsdp() const;

  ModelParallelOptions options_;                  // the data and tensor parts' options
  std::optional<PipelineOptions> pipeline_options_;  // set: a pipe dimension
  std::shared_ptr<ParallelStrategy> data_;        // DDPStrategy or FSDPStrategy
  std::unique_ptr<TensorParallelPlan> tensor_;
  std::unique_ptr<PipelinePlan> pipe_;            // null without a pipe dimension
  std::shared_ptr<DeviceMesh> mesh_;
  std::set<const torch::nn::Module*> parallelized_;  // split while materialised from the meta device
  std::unique_ptr<Layout> layout_;                // placements()
};

}  // namespace lightning::fabric
