// The composed strategy (composed.h): one mesh, a data part (ddp or fsdp on the mesh's groups), a
// tensor part and, under the pipeline, a pipe part; the placement and the gradient norm composed
// from the parts' factors.
#include "lightning/fabric/strategies/composed.h"

#include <ATen/ATen.h>
#include <torch/types.h>

#include <algorithm>
#include <map>

#include "lightning/fabric/checkpoint/sharded_checkpoint.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/ddp.h"
#include "lightning/fabric/strategies/fsdp.h"
#include "lightning/fabric/strategies/pipeline_plan.h"
#include "lightning/fabric/strategies/rank_zero_build.h"
#include "lightning/fabric/strategies/tensor_parallel_plan.h"
#include "lightning/fabric/utilities/meta_init.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

namespace {
// model_parallel's options for the data and tensor parts of a pipeline.
ModelParallelOptions data_and_tensor_options(const PipelineOptions& pipeline) {
  ModelParallelOptions options;
  options.parallelize = pipeline.parallelize;
  options.data_parallel_size = pipeline.data_parallel_size;
  options.tensor_parallel_size = pipeline.tensor_parallel_size;
  options.data_parallel_strategy = pipeline.data_parallel_strategy;
  options.data_parallel = pipeline.data_parallel;
  options.fully_sharded = pipeline.fully_sharded;
  return options;
}

std::shared_ptr<ParallelStrategy> data_part(const StrategyContext& context, const ModelParallelOptions& options) {
  if (options.data_parallel_strategy == "fsdp") return std::make_shared<FSDPStrategy>(context, options.fully_sharded);
  return std::make_shared<DDPStrategy>(context, options.data_parallel);
}
}  // namespace

// The checkpoint engine's questions, answered by composing the parts' factors of a tensor's
// placement: the tensor part's box (a split parameter's slice), fsdp's flat range inside it, and
// who writes: one rank of each part's replicas (data x context rank 0 for a slice under ddp, the first
// replica of a shard under fsdp, tensor rank 0 for what every tensor rank holds whole, the
// stage's first rank for a stage's unsplit tensors).
class ComposedStrategy::Layout : public CheckpointLayout {
 public:
  Layout(const ComposedStrategy& strategy) : strategy_(strategy), fsdp_(strategy.fsdp()) {}

  std::optional<Placement> placement(const at::Tensor& tensor) const override {
    const TensorParallelPlan& plan = *strategy_.tensor_;
    const DeviceMesh& mesh = *strategy_.mesh_;
    if (fsdp_ != nullptr) {
      if (auto shard = fsdp_->placements()->placement(tensor)) {  // a flat range of this rank's slice
        if (auto box = plan.split_placement(fsdp_->parameter_of(tensor), shard->global_shape)) {
          box->flat = shard->flat;
          box->writes = shard->writes;
          return box;
        }
        shard->writes = shard->writes && mesh.coordinate("tensor") == 0;
        return shard;
      }
    }
    if (auto box = plan.split_placement(tensor, tensor.sizes().vec())) {
      box->writes = mesh.coordinate(strategy_.replicas()) == 0;
      return box;
    }
    if (strategy_.pipe_ == nullptr) return std::nullopt;
    Placement whole = Placement::whole(tensor.sizes().vec());
    whole.writes = writes_unplaced();
    return whole;
  }
  at::Tensor saved_value(const at::Tensor& parameter) const override {
    if (fsdp_ != nullptr && fsdp_->placements()->placement(parameter)) {
      return fsdp_->placements()->saved_value(parameter);
    }
    return parameter;
  }
  std::vector<std::string> optimizer_parameter_names(const State& state, torch::optim::Optimizer& optimizer) const override {
    if (fsdp_ != nullptr) return fsdp_->placements()->optimizer_parameter_names(state, optimizer);
    return CheckpointLayout::optimizer_parameter_names(state, optimizer);
  }
  int64_t parameter_position(const State& state, const std::string& name) const override {
    if (strategy_.pipe_ != nullptr) return PipelinePlan::layer_position(state, name);
    return CheckpointLayout::parameter_position(state, name);
  }
  StateDict restore(State& state, const StateDict& local, bool strict) override {
    if (fsdp_ != nullptr) return fsdp_->placements()->restore(state, local, strict);
    return CheckpointLayout::restore(state, local, strict);
  }
  /// Under the pipeline each stage's tensors live on its ranks only.
  bool every_rank_holds_every_tensor() const override { return strategy_.pipe_ == nullptr; }
  bool writes_unplaced() const override {
    return strategy_.pipe_ != nullptr && strategy_.mesh_->coordinate("stage") == 0;
  }

 private:
  const ComposedStrategy& strategy_;
  FSDPStrategy* fsdp_;
};

ComposedStrategy::ComposedStrategy(StrategyContext context, ModelParallelOptions options)
    : ParallelStrategy(context, options.data_parallel_strategy == "fsdp" ? options.fully_sharded.process_group
                                                                         : options.data_parallel.process_group),
      options_(std::move(options)),
      data_(data_part(context, options_)),
      tensor_(std::make_unique<TensorParallelPlan>(options_)),
      layout_(std::make_unique<Layout>(*this)) {}

ComposedStrategy::ComposedStrategy(StrategyContext context, PipelineOptions options)
    : ParallelStrategy(context, options.data_parallel_strategy == "fsdp" ? options.fully_sharded.process_group
                                                                         : options.data_parallel.process_group),
      options_(data_and_tensor_options(options)),
      pipeline_options_(options),
      data_(data_part(context, options_)),
      tensor_(std::make_unique<TensorParallelPlan>(options_)),
      pipe_(std::make_unique<PipelinePlan>(std::move(options))),
      layout_(std::make_unique<Layout>(*this)) {}

ComposedStrategy::~ComposedStrategy() = default;

std::string ComposedStrategy::name() const { return options_.data_parallel.name; }

FSDPStrategy* ComposedStrategy::fsdp() const {
  return fully_sharded() ? static_cast<FSDPStrategy*>(data_.get()) : nullptr;
}

Strategy* ComposedStrategy::data_parallel_part() const { return data_.get(); }

uint64_t ComposedStrategy::operation_count() const {
  if (mesh_ == nullptr) return ParallelStrategy::operation_count();
  std::set<const Collective*> groups{shared_collective().get()};  // the data part's are the mesh's
  for (const auto& name : mesh_->names()) groups.insert(&mesh_->group(name));
  for (const char* name : {"data", "data_context", "shard_context", "stage"}) {
    if (mesh_->has(name)) groups.insert(&mesh_->group(name));
  }
  if (pipe_ != nullptr) groups.insert(&pipe_->gradient_group());
  uint64_t count = 0;
  for (const Collective* group : groups) count += group->operation_count();
  return count;
}

bool ComposedStrategy::hybrid() const {
  return fully_sharded() && options_.fully_sharded.sharding_strategy == ShardingStrategy::HybridShard;
}

std::vector<MeshDimension> ComposedStrategy::dimensions() const {
  const std::string data_dimension = fully_sharded() ? "shard" : "replicate";
  if (pipe_ != nullptr) {
    const auto [pipe, data] = pipe_->shape(world_size());
    return {{"pipe", pipe}, {data_dimension, data}, {"tensor", pipeline_options_->tensor_parallel_size}};
  }
  const int context = options_.context_parallel_size;
  LF_CHECK(world_size() % context == 0, ValueError, "ModelParallelOptions: context_parallel_size=", context,
           " does not divide the world size ", world_size(), ". Choose a divisor of ", world_size(), ".");
  // Without tensor_parallel_size, the devices per node left after the context dimension.
  const auto [data, tensor] = tensor_->mesh_shape(world_size() / context, std::max(1, num_processes() / context));
  std::vector<MeshDimension> dimensions;
  if (!hybrid()) {
    dimensions = {{data_dimension, data}};
  } else {  // HSDP: each replica sharded over `shard` ranks of the data dimension (a node's by default)
    const int shard = options_.data_parallel_shard_size.value_or(std::max(1, num_processes() / (tensor * context)));
    LF_CHECK(data > 0 && data % shard == 0, ValueError, "ModelParallelOptions: HYBRID_SHARD shards each replica over ",
             shard, " data ranks (data_parallel_shard_size", options_.data_parallel_shard_size ? "" : " unset: the "
             "devices per node / (tensor_parallel_size x context_parallel_size)", "), which does not divide the data "
             "size ", data, " (world size ", world_size(), " / tensor_parallel_size ", tensor, " / context_parallel_size ",
             context, "). Set data_parallel_shard_size to a divisor of ", data, ".");
    dimensions = {{"replicate", data / shard}, {"shard", shard}};
  }
  if (context > 1) dimensions.push_back({"context", context});
  dimensions.push_back({"tensor", tensor});
  return dimensions;
}

std::string ComposedStrategy::replicas() const {
  return options_.context_parallel_size > 1 ? "data_context" : "data";
}

std::vector<std::string> ComposedStrategy::data_dimensions() const {
  if (hybrid()) return {"replicate", "shard"};
  return {fully_sharded() ? "shard" : "replicate"};
}

void ComposedStrategy::setup_environment() {
  if (mesh_ != nullptr) return;
  ParallelStrategy::setup_environment();
  auto mesh = std::make_shared<DeviceMesh>(shared_collective(), dimensions());
  std::vector<std::string> stage = data_dimensions();
  mesh->flatten(stage, "data");
  // Context peers hold the same model and see parts of the same samples: their gradients are
  // averaged with the data ranks' (and fsdp shards over them too), as TorchTitan's dp_cp.
  const bool context = mesh->has("context");
  if (context) mesh->flatten([&] { auto dims = stage; dims.push_back("context"); return dims; }(), "data_context");
  if (context && fully_sharded()) mesh->flatten({"shard", "context"}, "shard_context");
  stage.push_back("tensor");
  if (pipe_ != nullptr) mesh->flatten(stage, "stage");
  DataGroups groups;
  groups.data = mesh->shared_group(replicas());
  if (fully_sharded()) groups.shard = mesh->shared_group(context ? "shard_context" : "shard");
  if (hybrid()) groups.replicate = mesh->shared_group("replicate");
  if (pipe_ != nullptr) groups.module_copies = mesh->shared_group("stage");
  data_->run_on(shared_collective(), std::move(groups));
  tensor_->use_mesh(mesh);
  if (pipe_ != nullptr) pipe_->form(mesh);
  mesh_ = std::move(mesh);
  // Every rank has made all its groups before any goes on: a rank refused right after (a model the
  // stages cannot split) closes its connections when it ends, and a rank still connecting a
  // group to it would fail there (gloo's connectFullMesh) instead of reaching its own refusal.
  if (pipe_ != nullptr) shared_collective()->barrier();
}

const std::shared_ptr<DeviceMesh>& ComposedStrategy::device_mesh() const {
  LF_CHECK(mesh_ != nullptr, RuntimeError, "Strategy '", name(), "' has no device mesh yet: its mesh forms in "
           "setup_environment (fabric.launch() or the first fabric.setup); call it after.");
  return mesh_;
}

int ComposedStrategy::pipe_size() const { return pipe_ != nullptr ? pipe_->pipe_size() : 1; }
int ComposedStrategy::pipe_rank() const { return pipe_ != nullptr ? pipe_->pipe_rank() : 0; }
std::vector<int> ComposedStrategy::local_stages() const {
  return pipe_ != nullptr ? pipe_->local_stages() : std::vector<int>{0};
}
PipelineStepStats ComposedStrategy::last_step() const { return pipe_ != nullptr ? pipe_->last_step() : PipelineStepStats(); }

bool ComposedStrategy::builds_on_meta_device() const { return true; }

void ComposedStrategy::materialize_meta_tensors(torch::nn::Module& module) {
  setup_environment();
  if (pipe_ != nullptr) pipe_->keep_local_stages(PipelinePlan::as_pipeline(module));  // only this rank's stages get memory
  if (pipe_ != nullptr && mesh_->size("tensor") == 1) {  // nothing to split: the data part's materialisation
    data_->materialize_meta_tensors(module);
    return;
  }
  // Which parameters parallelize splits, learnt on the meta module, and the split of the meta
  // ones undone before the replay (fsdp: once its units are made, from the split shapes, as a
  // normal setup makes them): the record of the build belongs to the tensors as built.
  // Materialising then keeps each split parameter's slice of its full value (and fsdp its shard
  // of that), one parameter at a time. Parameters that are real already stay as parallelize split
  // them.
  std::vector<std::pair<at::Tensor, at::Tensor>> as_built;  // the module's tensor, a handle on its built geometry
  for (const auto& parameter : module.parameters()) {
    if (parameter.is_meta()) as_built.emplace_back(parameter, parameter.detach());
  }
  std::shared_ptr<torch::nn::Module> shared(&module, [](torch::nn::Module*) {});  // parallelize takes a shared_ptr
  tensor_->parallelize(shared);
  std::map<std::string, std::pair<int64_t, int64_t>> slices;  // name -> (dim, local size)
  for (const auto& item : module.named_parameters()) {
    if (auto dim = tensor_->split_dim(item.value())) slices[item.key()] = {*dim, item.value().size(*dim)};
  }
  const int tensor_rank = mesh_->coordinate("tensor");
  const auto restore_built = [&] {
    for (auto& [tensor, built] : as_built) tensor.set_data(built);
  };
  const auto slice = [&](const std::string& name, const at::Tensor& full) {
    auto found = slices.find(name);
    if (found == slices.end()) return full;
    const auto [dim, size] = found->second;
    return full.narrow(dim, tensor_rank * size, size).clone();
  };
  if (FSDPStrategy* sharded = fsdp()) {
    sharded->materialize_sliced(module, slice, restore_built);
  } else {
    restore_built();
    MaterializeOptions options = replay_rank_zero_build(*this);  // and each rank keeps its slices
    options.install = [&](const std::string& name, bool is_parameter, const at::Tensor& full) {
      return is_parameter ? slice(name, full) : full;
    };
    materialize_module(module, options);
  }
  parallelized_.insert(&module);
}

void ComposedStrategy::module_to_device(torch::nn::Module& module) const {
  if (pipe_ != nullptr) pipe_->keep_local_stages(PipelinePlan::as_pipeline(module));  // only this rank's stages move
  data_->module_to_device(module);
}

void ComposedStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  setup_environment();
  PipelineImpl* pipeline = nullptr;
  if (pipe_ != nullptr) {
    pipeline = &PipelinePlan::as_pipeline(*module);
    PipelinePlan::check_precision(*precision());
    pipe_->keep_local_stages(*pipeline);
    PipelinePlan::check_layers(*pipeline, collective(), /*refuse_fsdp_units=*/fully_sharded());
  }
  // Every tensor from the first rank of the ranks that split it (the world's, or the stage's),
  // before splitting: the tensors each tensor rank holds whole agree within the tensor group, and
  // each rank's slice is the slice of one tensor (as Python's distribute_tensor takes shards from
  // the mesh's first rank). A model materialised from the meta device is split already, and
  // every rank built the same values. The data part's setup then finds its group equal already.
  const bool splits = pipe_ == nullptr || mesh_->size("tensor") > 1;
  if (splits && parallelized_.erase(module.get()) == 0) {
    if (world_size() > 1) {
      broadcast_module_from_rank_zero(*module, {}, pipe_ != nullptr ? &mesh_->group("stage") : &collective());
    }
    tensor_->parallelize(module);
  }
  data_->setup_module(module);
  if (pipeline != nullptr) pipe_->attach(*pipeline, global_rank(), root_device());
}

void ComposedStrategy::setup_optimizer(torch::optim::Optimizer& optimizer) {
  if (pipe_ != nullptr) pipe_->keep_local_parameters(optimizer);
  data_->setup_optimizer(optimizer);
}

ModulePolicy ComposedStrategy::activation_checkpointing() const { return data_->activation_checkpointing(); }

ScopeGuard ComposedStrategy::no_backward_sync(const torch::nn::Module& module, bool enabled) {
  return data_->no_backward_sync(module, enabled);
}

void ComposedStrategy::backward(at::Tensor& loss, torch::nn::Module* module, const BackwardOptions& options) {
  if (pipe_ != nullptr) PipelinePlan::check_backward(options);
  data_->backward(loss, module, options);
}

void ComposedStrategy::before_grad(bool create_graph) { data_->before_grad(create_graph); }

bool ComposedStrategy::optimizer_step(torch::optim::Optimizer& optimizer,
                                      const torch::optim::Optimizer::LossClosure& closure, StepKernel kernel) {
  return data_->optimizer_step(optimizer, closure, kernel);
}

void ComposedStrategy::before_forward(const torch::nn::Module& module) { data_->before_forward(module); }
at::Tensor ComposedStrategy::convert_input(const at::Tensor& input) const { return data_->convert_input(input); }
void ComposedStrategy::annotate_forward_error(const torch::nn::Module& module, const std::exception& error) {
  data_->annotate_forward_error(module, error);
}

std::vector<std::pair<std::string, at::Tensor>> ComposedStrategy::trained_tensors(const torch::nn::Module& module) {
  return data_->trained_tensors(module);
}

void ComposedStrategy::trained_tensors_changed() { data_->trained_tensors_changed(); }

CheckpointLayout* ComposedStrategy::placements() { return layout_.get(); }

Strategy::SamplerShare ComposedStrategy::sampler_share() const {
  // The data dimensions are adjacent: rank = (outer x data + data rank) x inner + inner rank,
  // inner being the dimensions after them (context, tensor).
  int data = 1, inner = 1;
  for (const auto& dimension : dimensions()) {
    const bool is_data = dimension.name == "replicate" || dimension.name == "shard";
    data *= is_data ? dimension.size : 1;
    inner = is_data ? 1 : inner * dimension.size;
  }
  return {data, global_rank() / inner % data};
}

CheckpointWrite ComposedStrategy::prepare_checkpoint(const std::string& call, const fs::path& path, const State& state,
                                                     const StateFilter& filter, bool host_copy) {
  setup_environment();
  return prepare_sharded_save(collective(), call, path, state, filter, host_copy, *layout_,
                              pipe_ == nullptr && options_.state_dict_type == "full");
}

StateDict ComposedStrategy::load_checkpoint(const fs::path& path, State* state, bool strict) {
  setup_environment();
  return load_sharded(collective(), path, state, strict, *layout_);
}

}  // namespace lightning::fabric
