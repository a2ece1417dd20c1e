// Both model_parallel strategies: ddp (ModelParallelStrategy) or fsdp (FSDPModelParallelStrategy)
// on the data dimension of the mesh, tensor parallelism on the other (TensorParallelPlan).
#include "lightning/fabric/strategies/model_parallel.h"

#include <ATen/ATen.h>

#include "lightning/fabric/checkpoint/sharded_checkpoint.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/fsdp_engine.h"
#include "lightning/fabric/strategies/tensor_parallel_plan.h"
#include "lightning/fabric/tensor_parallel/layers.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

namespace {
// options, after refusing what fsdp cannot do on a 2-D mesh's data group.
const ModelParallelOptions& fully_sharded_checked(const ModelParallelOptions& options) {
  LF_CHECK(options.fully_sharded.sharding_strategy != ShardingStrategy::HybridShard, ValueError,
           "ModelParallelOptions: fully_sharded.sharding_strategy=HYBRID_SHARD cannot apply to the data group of a 2-D "
           "(data x tensor) mesh: it shards within a node and replicates across nodes, which needs a third mesh "
           "dimension. Choose FULL_SHARD, SHARD_GRAD_OP or NO_SHARD (sharded over the whole data group).");
  return options;
}
}  // namespace

ModelParallelOptions::ModelParallelOptions() {
  parallelize = [](const std::shared_ptr<torch::nn::Module>& module, const std::shared_ptr<DeviceMesh>& mesh) {
    tensor_parallel::shard_tensor_parallel_layers(*module, mesh);
  };
  data_parallel.name = "model_parallel";
}

StrategySpec model_parallel_strategy(ModelParallelOptions options) {
  LF_CHECK(options.parallelize != nullptr, ValueError, "ModelParallelOptions: parallelize is empty. Give the function "
           "that applies tensor parallelism to the model, or keep the default (shard every tensor-parallel layer).");
  for (const auto& [name, size] : {std::pair{"data_parallel_size", options.data_parallel_size},
                                   std::pair{"tensor_parallel_size", options.tensor_parallel_size}}) {
    LF_CHECK(!size || *size > 0, ValueError, "ModelParallelOptions: ", name, "=", size.value_or(0),
             " must be positive, or unset.");
  }
  LF_CHECK(options.state_dict_type == "sharded" || options.state_dict_type == "full", ValueError,
           "ModelParallelOptions: state_dict_type=\"", options.state_dict_type,
           "\" is not valid. Choose \"sharded\" (a folder, every rank writes its parts) or \"full\" (one file).");
  LF_CHECK(options.data_parallel_strategy == "ddp" || options.data_parallel_strategy == "fsdp", ValueError,
           "ModelParallelOptions: data_parallel_strategy=\"", options.data_parallel_strategy, "\" is not valid. Choose "
           "\"ddp\" (every data replica holds its tensor-parallel slices whole) or \"fsdp\" (the slices are sharded "
           "again over the data group).");
  const std::string name = options.data_parallel.name;
  if (options.data_parallel_strategy == "ddp") {
    ddp_strategy(options.data_parallel);  // checks the ddp settings
    return StrategySpec{name, [options](StrategyContext context) -> std::shared_ptr<Strategy> {
                          return std::make_shared<ModelParallelStrategy>(std::move(context), options);
                        }};
  }
  fully_sharded_checked(options);
  options.fully_sharded.state_dict_type = options.state_dict_type;
  fsdp_strategy(options.fully_sharded);  // checks the fsdp settings
  return StrategySpec{name, [options](StrategyContext context) -> std::shared_ptr<Strategy> {
                        return std::make_shared<FSDPModelParallelStrategy>(std::move(context), options);
                      }};
}

// ---- ddp on the data dimension ----

ModelParallelStrategy::ModelParallelStrategy(StrategyContext context, ModelParallelOptions options)
    : DDPStrategy(std::move(context), options.data_parallel),
      plan_(std::make_unique<TensorParallelPlan>(std::move(options))) {}

ModelParallelStrategy::~ModelParallelStrategy() = default;

void ModelParallelStrategy::setup_environment() {
  if (plan_->has_mesh()) return;
  DDPStrategy::setup_environment();
  plan_->form_mesh(collective(), num_processes());
}

const std::shared_ptr<DeviceMesh>& ModelParallelStrategy::device_mesh() const { return plan_->mesh(); }

std::shared_ptr<Collective> ModelParallelStrategy::data_parallel_group() { return device_mesh()->shared_group("data"); }

void ModelParallelStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  setup_environment();
  // Every tensor from global rank 0, before splitting: the tensors each tensor rank holds whole
  // agree within the tensor group, and each rank's slice is the slice of rank 0's tensor (as
  // Python's distribute_tensor takes shards from the mesh's first rank). The ddp setup below then
  // finds the data group equal already.
  if (world_size() > 1) broadcast_module_from_rank_zero(*module, {}, &collective());
  plan_->parallelize(module);
  DDPStrategy::setup_module(module);
}

Strategy::SamplerShare ModelParallelStrategy::sampler_share() const {
  const auto [data, tensor] = plan_->mesh_shape(world_size(), num_processes());
  return {data, global_rank() / tensor};
}

double ModelParallelStrategy::clip_gradients_by_norm(const std::vector<at::Tensor>& parameters, double max_norm,
                                                     double norm_type, bool error_if_nonfinite) {
  // A split parameter's parts are summed over the tensor group; a replicated one, whose gradient
  // every rank of the group holds whole (and every data replica alike after the average), once.
  std::vector<at::Tensor> split, whole;
  for (const auto& parameter : parameters) (plan_->split_dim(parameter) ? split : whole).push_back(parameter);
  return TensorParallelPlan::clip(split, whole, {&device_mesh()->group("tensor")}, {}, max_norm, norm_type,
                                  error_if_nonfinite, root_device());
}

CheckpointWrite ModelParallelStrategy::prepare_checkpoint(const std::string& call, const fs::path& path,
                                                          const State& state, const StateFilter& filter, bool host_copy) {
  return prepare_sharded_save(*this, call, path, state, filter, host_copy, *plan_,
                              plan_->options().state_dict_type == "full");
}

StateDict ModelParallelStrategy::load_checkpoint(const fs::path& path, State* state, bool strict) {
  return load_sharded(*this, path, state, strict, *plan_);
}

// ---- fsdp on the data dimension ----

FSDPModelParallelStrategy::FSDPModelParallelStrategy(StrategyContext context, ModelParallelOptions options)
    : FSDPStrategy(std::move(context), fully_sharded_checked(options).fully_sharded),
      plan_(std::make_unique<TensorParallelPlan>(std::move(options))) {
  // fsdp shards each parameter as this rank holds it (its tensor-parallel slice); in checkpoints
  // the shard is a flat range of the slice's box. A whole parameter's shards are the same on
  // every rank of a tensor group: its first rank writes them.
  engine_->outer_placement = [this](const at::Tensor& parameter, const std::vector<int64_t>& shape) {
    if (auto split = plan_->split_placement(parameter, shape)) return *split;
    Placement whole = Placement::whole(shape);
    whole.writes = plan_->mesh()->coordinate("tensor") == 0;
    return whole;
  };
}

FSDPModelParallelStrategy::~FSDPModelParallelStrategy() = default;

std::string FSDPModelParallelStrategy::name() const { return plan_->options().data_parallel.name; }

void FSDPModelParallelStrategy::setup_environment() {
  if (plan_->has_mesh()) return;
  FSDPStrategy::setup_environment();
  plan_->form_mesh(collective(), num_processes());
  shard_over(plan_->mesh()->shared_group("data"));
}

const std::shared_ptr<DeviceMesh>& FSDPModelParallelStrategy::device_mesh() const { return plan_->mesh(); }

Collective& FSDPModelParallelStrategy::data_parallel_group() { return device_mesh()->group("data"); }

int FSDPModelParallelStrategy::data_parallel_size() const {
  return plan_->mesh_shape(world_size(), num_processes()).first;
}

int FSDPModelParallelStrategy::data_parallel_rank() const {
  return global_rank() / plan_->mesh_shape(world_size(), num_processes()).second;
}

Strategy::SamplerShare FSDPModelParallelStrategy::sampler_share() const {
  return {data_parallel_size(), data_parallel_rank()};
}

void FSDPModelParallelStrategy::materialize_meta_tensors(torch::nn::Module& module) {
  setup_environment();
  // Which parameters parallelize splits, learnt on the meta module, and the split of the meta
  // ones undone once the units are made (from the split shapes, as a normal setup makes them):
  // the record of the build belongs to the tensors as built. Materialising then keeps each split
  // parameter's slice of its full value (and fsdp its shard of that), one parameter at a time.
  // Parameters that are real already stay as parallelize split them.
  std::vector<std::pair<at::Tensor, at::Tensor>> as_built;  // the module's tensor, a handle on its built geometry
  for (const auto& parameter : module.parameters()) {
    if (parameter.is_meta()) as_built.emplace_back(parameter, parameter.detach());
  }
  std::shared_ptr<torch::nn::Module> shared(&module, [](torch::nn::Module*) {});  // parallelize takes a shared_ptr
  plan_->parallelize(shared);
  std::map<std::string, std::pair<int64_t, int64_t>> slices;  // name -> (dim, local size)
  for (const auto& item : module.named_parameters()) {
    if (auto dim = plan_->split_dim(item.value())) slices[item.key()] = {*dim, item.value().size(*dim)};
  }
  const int tensor_rank = device_mesh()->coordinate("tensor");
  try {
    materialize_in_units(module, [&] {
      for (auto& [tensor, built] : as_built) tensor.set_data(built);
      engine_->slice_before_sharding = [slices, tensor_rank](const std::string& name, const at::Tensor& full) {
        auto found = slices.find(name);
        if (found == slices.end()) return full;
        const auto [dim, size] = found->second;
        return full.narrow(dim, tensor_rank * size, size).clone();
      };
    });
  } catch (...) {
    engine_->slice_before_sharding = nullptr;
    throw;
  }
  engine_->slice_before_sharding = nullptr;
  parallelized_.insert(&module);
}

void FSDPModelParallelStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  setup_environment();
  if (parallelized_.erase(module.get()) == 0) {
    // As under ddp: rank 0's whole model everywhere, then split (the fsdp setup below checks the
    // data group and shards). A model materialised from the meta device is split already, and
    // every rank built the same values.
    if (world_size() > 1) broadcast_module_from_rank_zero(*module, {}, &collective());
    plan_->parallelize(module);
  }
  FSDPStrategy::setup_module(module);
}

double FSDPModelParallelStrategy::clip_gradients_by_norm(const std::vector<at::Tensor>& parameters, double max_norm,
                                                         double norm_type, bool error_if_nonfinite) {
  // The optimizer steps shards, distinct across the shard group (the data group; under NO_SHARD
  // each rank its own whole copy). A split parameter's shards are also distinct across the tensor
  // group; a whole parameter's repeat there, so they are counted once.
  std::vector<at::Tensor> split, whole;
  for (const auto& shard : parameters) {
    const auto* p = engine_->find_shard(shard);
    (p != nullptr && plan_->split_dim(p->parameter) ? split : whole).push_back(shard);
  }
  std::vector<Collective*> shards;
  if (shard_group_size() > 1) shards.push_back(&shard_group());
  std::vector<Collective*> split_over = shards;
  split_over.push_back(&device_mesh()->group("tensor"));
  return TensorParallelPlan::clip(split, whole, split_over, shards, max_norm, norm_type, error_if_nonfinite,
                                  root_device());
}

}  // namespace lightning::fabric
