// The composed strategy's pipe part (composed.h): the pipe group and its twin for gradients,
// which layers this rank keeps, the schedule's executor attached to each set-up lf::Pipeline, the
// optimizer's share and the checks every pipeline makes. Private to the library
// (docs/pipeline-parallel.md).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lightning/fabric/checkpoint/state.h"
#include "lightning/fabric/strategies/pipeline.h"

namespace lightning::fabric {

class Collective;

class PipelinePlan {
 public:
  explicit PipelinePlan(PipelineOptions options);
  const PipelineOptions& options() const { return options_; }

  /// (pipe, data) for this world size; ValueError unless pipe x data x tensor makes it.
  std::pair<int, int> shape(int world_size) const;
  /// Takes the composed strategy's mesh (with "pipe" and a flattened "stage"), makes the pipe
  /// group's twin and connects each rank to its neighbouring stages' ranks (collective, once).
  void form(std::shared_ptr<DeviceMesh> mesh);
  bool formed() const { return mesh_ != nullptr; }
  /// RuntimeError before form.
  const std::shared_ptr<DeviceMesh>& mesh() const;
  /// This rank's pipe group (its neighbours in other stages, same data and tensor coordinates).
  Collective& pipe_group() const;
  /// The pipe group's twin, on which gradients travel.
  const Collective& gradient_group() const { return *gradient_group_; }
  /// Every rank of this rank's stage (the mesh's "stage" group: data x tensor of them).
  Collective& stage_group() const;
  int pipe_size() const;
  int pipe_rank() const;
  std::vector<int> local_stages() const;

  /// ValueError unless module is an lf::Pipeline.
  static PipelineImpl& as_pipeline(torch::nn::Module& module);
  /// Checks the split (once), then unregisters and frees every layer of other ranks' stages.
  void keep_local_stages(PipelineImpl& pipeline) const;
  /// After the data dimension's setup: notes this rank's parameters and gives the pipeline its
  /// executor.
  void attach(PipelineImpl& pipeline, int global_rank, at::Device device);
  /// The index of the layer that holds parameter `name` (its first component names the layer) of
  /// an lf::Pipeline among state's modules, or the largest int64 when none does: the whole
  /// model's order of parameters, which a rank knows although it keeps only its stages' layers.
  static int64_t layer_position(const State& state, const std::string& name);
  /// Drops other ranks' parameters from the optimizer's groups.
  void keep_local_parameters(torch::optim::Optimizer& optimizer) const;
  PipelineStepStats last_step() const { return *last_step_; }

  /// Refusals every pipeline shares: a precision with a loss scaler; backward options it cannot honour.
  static void check_precision(const Precision& precision);
  static void check_backward(const BackwardOptions& options);
  /// ValueError on every rank when activation checkpointing marked a layer of any rank (the
  /// executor calls the layers directly, so it would not take effect) or, refuse_fsdp_units, a
  /// layer holds an lf::FSDPUnit. A collective over world: every rank calls it at setup.
  static void check_layers(const PipelineImpl& pipeline, Collective& world, bool refuse_fsdp_units);

 private:
  PipelineOptions options_;
  std::shared_ptr<DeviceMesh> mesh_;
  std::shared_ptr<Collective> gradient_group_;    // this rank's pipe group again, for gradients
  std::shared_ptr<PipelineStepStats> last_step_;  // written by every attached pipeline's steps
  std::set<const c10::TensorImpl*> local_parameters_;
};

}  // namespace lightning::fabric
