// Pipeline parallelism: the model's layers in stages across the ranks of a "pipe" mesh
// dimension, micro-batches flowing through them under a schedule (GPipe, 1F1B, interleaved 1F1B),
// with ddp or fsdp on a "data" dimension and tensor parallelism inside each stage, as
// torch.distributed.pipelining with DDP or FSDP and tensor parallelism on the other mesh
// dimensions (docs/pipeline-parallel.md).
//
//   torch::nn::Sequential layers(embedding, block_1, ..., block_n, head);   // one tensor to the next
//   lf::Pipeline model(layers, [](const at::Tensor& logits, const at::Tensor& target) {
//     return cross_entropy(logits, target); });
//   lf::PipelineOptions pp;
//   pp.schedule = "1F1B";  pp.micro_batches = 8;  pp.data_parallel_size = 2;
//   lf::Fabric fabric(lf::FabricOptions().strategy(lf::pipeline_strategy(pp)).devices(8));
//   torch::optim::AdamW adamw(model->parameters());
//   auto [net, optimizer] = fabric.setup(model, adamw);
//   auto loss = net(input, target);  // every micro-batch's forward and backward, in schedule order
//   fabric.backward(loss);           // applies this step's gradients (and averages them over data)
//   optimizer.step();                // steps this rank's stages
//
// lf::Pipeline is an ordinary module: without the pipeline strategy (one device, ddp, fsdp) its
// forward runs the layers on the whole batch and returns the loss, so one loop serves both.
#pragma once

#include "lightning/fabric/export.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lightning/fabric/strategies/ddp.h"
#include "lightning/fabric/strategies/device_mesh.h"
#include "lightning/fabric/strategies/fsdp.h"
#include "lightning/fabric/strategies/model_parallel.h"

namespace lightning::fabric {

class PipelineRuntime;  // the schedule's executor (private to the library)

/// A model as consecutive layers (each takes the previous layer's output tensor and returns one
/// tensor) and the loss of the last layer's output against a target. Under the pipeline
/// strategy the layers are split into consecutive stages; elsewhere it is one module.
class LF_API PipelineImpl : public torch::nn::Module {
 public:
  using LossFunction = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;
  /// layers: a Sequential's children, registered here under the Sequential's names ("0", "1", ...),
  /// so state dicts and checkpoints name parameters as the Sequential does. loss: a mean over the
  /// batch (micro-batch losses are averaged). stage_starts: the index of each stage's first
  /// layer (0 first, increasing); empty: as even a split as the stage count allows at setup.
  /// ValueError for an empty Sequential, an empty loss, or stage_starts that do not split it.
  PipelineImpl(const torch::nn::Sequential& layers, LossFunction loss, std::vector<int64_t> stage_starts = {});

  /// The mean loss over the batch. Under the pipeline strategy (after fabric.setup), on every rank:
  /// input and target are the whole batch (each rank of a pipe group passes the same one: the
  /// first stage reads input, the last target), split into micro-batches along dimension 0; with
  /// gradients enabled every micro-batch's forward and backward runs in the schedule's order and
  /// backward(loss) then adds this step's gradients (times the loss's gradient) to this rank's
  /// parameters; under no_grad only the forwards run. Elsewhere: loss(layers(input), target).
  at::Tensor forward(const at::Tensor& input, const at::Tensor& target);

  /// The layers (as given; after setup under the pipeline strategy only this rank's keep their
  /// parameters registered).
  int64_t size() const { return static_cast<int64_t>(layers_.size()); }
  /// The split into `stages` stages: stage_starts as given (ValueError unless it has `stages`
  /// entries), else the layers dealt evenly, earlier stages one more when they do not divide.
  /// ValueError naming both counts when there are fewer layers than stages.
  std::vector<int64_t> stage_starts(int stages) const;
  /// The output of layers [begin, end) on input.
  at::Tensor run_layers(int64_t begin, int64_t end, const at::Tensor& input);
  const LossFunction& loss() const { return loss_; }

 private:
  friend class PipelinePlan;
  friend class PipelineRuntime;
  std::vector<std::pair<std::string, torch::nn::AnyModule>> layers_;
  LossFunction loss_;
  std::vector<int64_t> stage_starts_;
  std::shared_ptr<PipelineRuntime> runtime_;  // set by the pipeline strategy's setup
};
TORCH_MODULE(Pipeline);

struct LF_API PipelineOptions {
  PipelineOptions();
  /// Ranks along the pipe dimension (stages run on them in order). Unset: world size /
  /// (data_parallel_size x tensor_parallel_size), data_parallel_size counting 1 when unset.
  std::optional<int> pipeline_size;
  /// Replicas of the whole pipeline (ddp over each stage's data group). Unset: world size /
  /// (pipeline_size x tensor_parallel_size), or 1 when pipeline_size is unset too.
  std::optional<int> data_parallel_size;
  /// Ranks that split each stage's tensor-parallel layers (tensor_parallel/layers.h); 1: none.
  int tensor_parallel_size = 1;
  /// Applies tensor parallelism to this rank's stages (called once per set-up module with the
  /// strategy's mesh), as ModelParallelOptions::parallelize. Default: shard every tensor-parallel
  /// layer.
  std::function<void(const std::shared_ptr<torch::nn::Module>& module, const std::shared_ptr<DeviceMesh>& mesh)>
      parallelize;
  /// "GPipe", "1F1B" or "Interleaved1F1B" (torch.distributed.pipelining's ScheduleGPipe,
  /// Schedule1F1B, ScheduleInterleaved1F1B).
  std::string schedule = "1F1B";
  /// Micro-batches per step (torch's n_microbatches); must divide every batch's size.
  int micro_batches = 4;
  /// Stages on each rank: 1, or more with Interleaved1F1B or GPipe (stage s on pipe rank s % P).
  int stages_per_rank = 1;
  /// What runs on the data dimension: "ddp" (the mesh's "replicate" dimension: each stage's data
  /// replicas hold it whole) or "fsdp" ("shard": each stage's parameters, gradients and optimizer
  /// state sharded over its data group; a rank's stages are one sharding unit, gathered at the
  /// step's first forward and kept through the schedule until fabric.backward has
  /// reduce-scattered the step's gradients, as Python's fully_shard(reshard_after_forward=False)).
  std::string data_parallel_strategy = "ddp";
  /// The data dimension's ddp: buckets, process group, buffer broadcast. Its name is the
  /// strategy's ("pipeline") under either data dimension.
  DDPOptions data_parallel;
  /// The data dimension's fsdp: FULL_SHARD, SHARD_GRAD_OP or NO_SHARD, mixed precision, process
  /// group (units: each stage is one; auto_wrap is refused).
  FSDPOptions fully_sharded;
};

/// For FabricOptions().strategy(...). ValueError for non-positive sizes or micro_batches, an
/// unknown schedule or data_parallel_strategy, a schedule that cannot run stages_per_rank stages
/// per rank, or invalid ddp or fsdp settings.
LF_API StrategySpec pipeline_strategy(PipelineOptions options = PipelineOptions());

/// One training step of this rank, as the schedule ran it (PipelineParallel::last_step).
struct LF_API PipelineStepStats {
  double step_seconds = 0;      // from the first action to the last send's completion
  double compute_seconds = 0;   // forward_seconds + backward_seconds
  double forward_seconds = 0;   // in this rank's stage forwards (and the loss on the last stage)
  double backward_seconds = 0;  // in its backwards; the rest of the step is communication and waiting
  int peak_micro_batches = 0;   // most micro-batches whose activations this rank held at once
  /// The fraction of the step this rank idled (the bubble): 1 - compute / step.
  double idle_fraction() const { return step_seconds > 0 ? 1.0 - compute_seconds / step_seconds : 0.0; }
};

/// What the pipeline strategy offers (ComposedStrategy, composed.h), whatever runs on the data dimension:
/// fabric.strategy_as<lf::PipelineParallel>().last_step(). device_mesh() is the job's mesh
/// (device_mesh.h): dimensions "pipe", "replicate" (ddp) or "shard" (fsdp), and "tensor", in that
/// order, with the data dimension flattened as "data" too and every dimension but pipe as "stage"
/// (the ranks of one stage, which are consecutive). It is the mesh parallelize and the
/// tensor-parallel loss take.
class LF_API PipelineParallel : public MeshStrategy {
 public:
  virtual int pipe_size() const = 0;
  virtual int pipe_rank() const = 0;
  /// The stages this rank runs, along the model.
  virtual std::vector<int> local_stages() const = 0;
  /// The last training step's timing on this rank (zeros before the first).
  virtual PipelineStepStats last_step() const = 0;
};

}  // namespace lightning::fabric
