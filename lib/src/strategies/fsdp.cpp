// The fsdp strategy and its sharding engine; checkpoints are in fsdp_checkpoint.cpp.
#include "lightning/fabric/strategies/fsdp.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include <cmath>
#include <iostream>
#include <set>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/sync_batch_norm.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/fsdp_engine.h"
#include "lightning/fabric/strategies/rank_zero_build.h"
#include "lightning/fabric/utilities/meta_init.h"

namespace lightning::fabric {

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  if (name == "FULL_SHARD") return ShardingStrategy::FullShard;
  if (name == "SHARD_GRAD_OP") return ShardingStrategy::ShardGradOp;
  if (name == "NO_SHARD") return ShardingStrategy::NoShard;
  if (name == "HYBRID_SHARD") return ShardingStrategy::HybridShard;
  throw ValueError("sharding_strategy=\"" + name +
                   "\" is not valid. Choose one of: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD.");
}

std::string to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::FullShard: return "FULL_SHARD";
    case ShardingStrategy::ShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::NoShard: return "NO_SHARD";
    case ShardingStrategy::HybridShard: return "HYBRID_SHARD";
  }
  return "?";
}

StrategySpec fsdp_strategy(FSDPOptions options) {
  LF_CHECK(options.state_dict_type == "sharded" || options.state_dict_type == "full", ValueError,
           "FSDPOptions: state_dict_type=\"", options.state_dict_type, "\" is not valid. Choose \"sharded\" or \"full\".");
  check_process_group_settings("FSDPOptions", options.process_group);
  return StrategySpec{"fsdp", [options](StrategyContext context) -> std::shared_ptr<Strategy> {
                        return std::make_shared<FSDPStrategy>(std::move(context), options);
                      }};
}

namespace {
// Runs a function after AccumulateGrad has added a parameter's gradient.
struct AfterAccumulation : torch::autograd::FunctionPostHook {
  explicit AfterAccumulation(std::function<void()> action) : action(std::move(action)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    action();
    return outputs;
  }
  std::function<void()> action;
};

// A storage's memory given back and allocated again in place: tensors autograd saved from a
// parameter (views included) keep pointing at the same StorageImpl and see the refilled values.
void release_storage(const c10::Storage& storage) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, impl->device()));
  impl->set_nbytes(0);
}

void restore_storage(const c10::Storage& storage, size_t bytes) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(impl->allocator()->allocate(bytes));
  impl->set_nbytes(bytes);
}
}  // namespace

class FSDPStrategy::Engine::UnitHooks : public FSDPUnitImpl::Hooks {
 public:
  UnitHooks(Engine& engine, ShardedModule& sharded, size_t unit) : engine_(engine), sharded_(sharded), unit_(unit) {}
  at::Tensor before_forward(at::Tensor input) override {
    engine_.unit_before_forward(sharded_, sharded_.units[unit_]);
    return engine_.cast_input(input);
  }
  at::Tensor after_forward(at::Tensor output) override {
    return engine_.unit_after_forward(sharded_, sharded_.units[unit_], std::move(output));
  }

 private:
  Engine& engine_;
  ShardedModule& sharded_;
  size_t unit_;
};

FSDPStrategy::FSDPStrategy(StrategyContext context, FSDPOptions options)
    : ParallelStrategy(std::move(context), options.process_group),
      engine_(std::make_unique<Engine>(*this)),
      fsdp_options_(std::move(options)) {}

FSDPStrategy::~FSDPStrategy() = default;

int FSDPStrategy::shard_group_size() const {
  if (fsdp_options_.sharding_strategy == ShardingStrategy::NoShard) return 1;
  if (const Collective* group = formed_shard_group()) return group->world_size();
  return fsdp_options_.sharding_strategy == ShardingStrategy::HybridShard ? num_processes() : world_size();
}

int FSDPStrategy::shard_group_rank() const {
  if (fsdp_options_.sharding_strategy == ShardingStrategy::NoShard) return 0;
  if (const Collective* group = formed_shard_group()) return group->rank();
  return fsdp_options_.sharding_strategy == ShardingStrategy::HybridShard ? global_rank() % num_processes()
                                                                          : global_rank();
}

bool FSDPStrategy::Engine::frees_parameters() const {
  const ShardingStrategy sharding = strategy_.fsdp_options_.sharding_strategy;
  return sharding == ShardingStrategy::FullShard || sharding == ShardingStrategy::HybridShard;
}

void FSDPStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  setup_environment();
  for (const auto& child : module->modules()) {
    LF_CHECK(dynamic_cast<SyncBatchNormImpl*>(child.get()) == nullptr, ValueError, "fabric.setup: the model has an "
             "lf::SyncBatchNorm, which strategy \"fsdp\" does not support yet (its gathered parameters and the "
             "statistics' collectives are not ordered together). Use strategy \"ddp\", or torch::nn::BatchNorm "
             "(each rank's own statistics, as PyTorch's FSDP keeps them).");
  }
  if (const auto scaler = precision()->loss_scaler()) {  // each rank checks only its own shards for inf/NaN
    scaler->set_found_inf_reducer([this](at::Tensor& found_inf) { collective().all_reduce_(found_inf, ReduceOp::Max); });
  }
  if (fsdp_options_.sharding_strategy == ShardingStrategy::HybridShard) use_node_groups("fsdp");
  std::vector<std::shared_ptr<torch::nn::Module>> called;
  const auto wrapped = wrapped_before_materializing_.find(module.get());
  if (wrapped != wrapped_before_materializing_.end()) {
    called = std::move(wrapped->second);
    wrapped_before_materializing_.erase(wrapped);
  } else {
    called = wrap_units(*module);
  }
  if (const auto buffer_dtype = effective_mixed_precision().buffer_dtype) {
    torch::NoGradGuard no_grad;
    for (auto& buffer : module->buffers()) {
      if (buffer.is_floating_point() && buffer.scalar_type() != *buffer_dtype) buffer.set_data(buffer.to(*buffer_dtype));
    }
  }
  broadcast_module_from_rank_zero(*module, engine_->materialized(), &data_group());
  engine_->shard(module, called);
  engine_->forget_materialized();
}

std::vector<std::shared_ptr<torch::nn::Module>> FSDPStrategy::wrap_units(torch::nn::Module& module) {
  if (fsdp_options_.auto_wrap_min_params > 0) wrap_sequential_children(module, fsdp_options_.auto_wrap_min_params);
  return wrap_matching_modules(module, fsdp_options_.auto_wrap);
}

// Units are made first, while the parameters still show their full shapes (the size rule and
// policies read them); setup_module then takes them as made.
void FSDPStrategy::materialize_meta_tensors(torch::nn::Module& module) { materialize_sliced(module, nullptr); }

void FSDPStrategy::materialize_sliced(torch::nn::Module& module, const MaterializeSlice& slice,
                                      const std::function<void()>& before_replay) {
  setup_environment();
  wrapped_before_materializing_[&module] = wrap_units(module);
  try {
    if (before_replay) before_replay();
    engine_->materialize(module, slice);
  } catch (...) {
    wrapped_before_materializing_.erase(&module);
    engine_->forget_materialized();
    throw;
  }
}

void FSDPStrategy::Engine::forget_materialized() {
  presets_.clear();
  materialized_.clear();
}

void FSDPStrategy::Engine::materialize(torch::nn::Module& module, const MaterializeSlice& slice) {
  MaterializeOptions options = replay_rank_zero_build(strategy_);  // one build for every rank: rank 0's
  // Shapes are compared before the replay: afterwards the sharded parameters hold 0 elements.
  std::vector<at::Tensor> all = module.parameters();
  for (const auto& buffer : module.buffers()) all.push_back(buffer);
  strategy_.module_copies_group().check_same_tensors(all, "The model passed to fabric.setup");
  const int parts = strategy_.shard_group_size(), part = strategy_.shard_group_rank();
  std::map<std::string, const c10::TensorImpl*> by_name;
  for (const auto& item : module.named_parameters()) by_name.emplace(item.key(), item.value().unsafeGetTensorImpl());
  for (const auto& item : module.named_buffers()) by_name.emplace(item.key(), item.value().unsafeGetTensorImpl());
  options.install = [&](const std::string& name, bool is_parameter, const at::Tensor& full) -> at::Tensor {
    const c10::TensorImpl* impl = by_name.at(name);
    materialized_.insert(impl);
    const at::Tensor held = is_parameter && slice ? slice(name, full) : full;
    if (!is_parameter || !frees_parameters()) return held;
    const ShardSlice slice = shard_slice(held.numel(), parts, part);
    presets_[impl] = Preset{held.reshape(-1).narrow(0, slice.begin, slice.length).clone(), held.sizes().vec()};
    return at::empty({0}, held.options());
  };
  materialize_module(module, options);
}

FSDPMixedPrecision FSDPStrategy::effective_mixed_precision() const {
  return resolve_mixed_precision(fsdp_options_.mixed_precision, precision()->name());
}

FSDPMixedPrecision resolve_mixed_precision(FSDPMixedPrecision dtypes, const std::string& name) {
  std::optional<c10::ScalarType> low;
  if (name == "bf16-mixed" || name == "bf16-true") low = at::kBFloat16;
  if (name == "16-mixed" || name == "16-true") low = at::kHalf;
  if (!dtypes.param_dtype) dtypes.param_dtype = low;
  if (!dtypes.reduce_dtype) dtypes.reduce_dtype = dtypes.param_dtype;  // Python: param_dtype when unset
  if (!dtypes.buffer_dtype) dtypes.buffer_dtype = low;
  return dtypes;
}

at::Tensor FSDPStrategy::convert_input(const at::Tensor& input) const { return engine_->cast_input(input); }

at::Tensor FSDPStrategy::Engine::cast_input(const at::Tensor& input) const {
  const auto dtype = dtypes_.param_dtype;
  if (!dtype || !input.defined() || !input.is_floating_point() || input.scalar_type() == *dtype) return input;
  return input.to(*dtype);
}

c10::ScalarType FSDPStrategy::Engine::full_dtype(const ShardedParameter& p, bool full_precision) const {
  const c10::ScalarType own = p.shard.scalar_type();
  if (full_precision || !dtypes_.param_dtype || !c10::isFloatingType(own)) return own;
  return *dtypes_.param_dtype;
}

void FSDPStrategy::annotate_forward_error(const torch::nn::Module& module, const std::exception& error) {
  (void)error;  // propagates unchanged; the hint goes to stderr beside it
  const std::string hint = engine_->skipped_units_hint(module, /*after_backward=*/false);
  if (!hint.empty()) std::cerr << "lightning-fabric: " << hint << std::endl;
}

std::string FSDPStrategy::Engine::skipped_units_hint(const torch::nn::Module& module, bool after_backward) {
  ShardedModule* sharded = find(module);
  if (sharded == nullptr) return {};
  std::string missed;
  for (const auto& unit : sharded->units) {
    if (!unit.via_call || unit.entered) continue;
    bool counts = !after_backward;  // in a failed forward: any unit not reached (it may come later)
    for (size_t i : unit.parameters) {
      const at::Tensor& parameter = sharded->parameters[i].parameter;
      if (!after_backward) counts &= frees_parameters() && parameter.numel() == 0;  // still sharded
      if (after_backward) counts |= parameter.grad().defined();  // it ran, but not through lf::call
    }
    if (counts) missed += (missed.empty() ? "'" : ", '") + unit.name + "'";
  }
  if (missed.empty()) return {};
  const std::string what = after_backward ? " ran in this step without lf::call, so they were never gathered again "
                                            "after an optimizer step (stale weights)"
                                          : " had not run when this forward failed; their parameters are shards until "
                                            "their forward runs through lf::call";
  return "fsdp: the sharding units " + missed + " (made by FSDPOptions::auto_wrap)" + what +
         ". If the parent's forward calls them directly, call them as lf::call(block, x) (LibTorch modules have no "
         "forward hooks; docs/fsdp.md, \"Sharding units\").";
}

void FSDPStrategy::Engine::shard(const std::shared_ptr<torch::nn::Module>& module,
                                 const std::vector<std::shared_ptr<torch::nn::Module>>& called) {
  torch::NoGradGuard no_grad;
  auto sharded = std::make_unique<ShardedModule>();
  sharded->address = module.get();
  sharded->module = module;
  const int parts = strategy_.shard_group_size(), part = strategy_.shard_group_rank();
  dtypes_ = strategy_.effective_mixed_precision();
  for (const auto& parameter : module->parameters()) {
    sharded->casts |= dtypes_.param_dtype && parameter.is_floating_point() && parameter.scalar_type() != *dtypes_.param_dtype;
  }
  for (const auto& item : module->named_parameters(true)) {
    ShardedParameter p;
    p.name = item.key();
    p.parameter = item.value();
    const auto preset = presets_.find(p.parameter.unsafeGetTensorImpl());
    p.shape = preset != presets_.end() ? preset->second.shape : item.value().sizes().vec();
    p.numel = c10::multiply_integers(p.shape);
    p.chunk = (p.numel + parts - 1) / parts;
    p.slice = shard_slice(p.numel, parts, part);
    if (preset != presets_.end()) {  // materialised from the meta device as this shard only
      p.shard = preset->second.shard.to(p.parameter.options());  // the 0-element parameter's dtype and device after setup's cast and move
    } else {
      at::Tensor flat = p.parameter.detach().view(-1).narrow(0, p.slice.begin, p.slice.length);
      // FULL_SHARD and HYBRID_SHARD keep the shard in its own memory (the full parameter is freed),
      // and so does a cast to a param dtype (the full parameter is then another dtype); otherwise
      // SHARD_GRAD_OP and NO_SHARD step a view of the full parameter in place.
      p.shard = frees_parameters() || sharded->casts ? flat.clone() : flat;
    }
    sharded->parameters.push_back(std::move(p));
  }
  build_units(*sharded, *module, called);
  for (auto& unit : sharded->units) {
    if (frees_parameters()) {
      free_full_parameters(*sharded, unit);
    } else if (sharded->casts) {
      unit.stale = true;  // the first forward gathers the full parameters in the param dtype
    }
  }
  for (const auto& p : sharded->parameters) {  // the vector is final: its entries keep their addresses
    by_shard_[p.shard.unsafeGetTensorImpl()] = &p;
    by_tensor_[p.shard.unsafeGetTensorImpl()] = &p;
    by_tensor_[p.parameter.unsafeGetTensorImpl()] = &p;
  }
  modules_.push_back(std::move(sharded));
}

void FSDPStrategy::Engine::build_units(ShardedModule& sharded, torch::nn::Module& module,
                                       const std::vector<std::shared_ptr<torch::nn::Module>>& called) {
  std::map<const c10::TensorImpl*, size_t> index_of;
  for (size_t i = 0; i < sharded.parameters.size(); ++i) index_of[sharded.parameters[i].parameter.unsafeGetTensorImpl()] = i;
  std::set<const torch::nn::Module*> called_set;
  for (const auto& m : called) called_set.insert(m.get());
  std::vector<torch::nn::Module*> unit_modules;  // in tree order, outer before inner
  std::vector<std::string> unit_names;
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    torch::nn::Module* child = item.value().get();
    if (dynamic_cast<FSDPUnitImpl*>(child) == nullptr && called_set.count(child) == 0) continue;
    unit_modules.push_back(child);
    unit_names.push_back(item.key());
  }
  // Deepest units claim their parameters first; unit 0 takes what is left.
  std::vector<int> owner(sharded.parameters.size(), 0);
  std::vector<bool> claimed(sharded.parameters.size(), false);
  for (size_t u = unit_modules.size(); u-- > 0;) {
    for (const auto& parameter : unit_modules[u]->parameters()) {
      const size_t i = index_of.at(parameter.unsafeGetTensorImpl());
      if (!claimed[i]) owner[i] = static_cast<int>(u) + 1, claimed[i] = true;
    }
  }
  sharded.units.resize(unit_modules.size() + 1);
  for (size_t u = 0; u < unit_modules.size(); ++u) {
    sharded.units[u + 1].module = unit_modules[u];
    sharded.units[u + 1].name = unit_names[u];
  }
  for (size_t i = 0; i < sharded.parameters.size(); ++i) sharded.units[static_cast<size_t>(owner[i])].parameters.push_back(i);
  for (size_t u = 1; u < sharded.units.size(); ++u) {
    auto hooks = std::make_shared<UnitHooks>(*this, sharded, u);
    if (auto* declared = dynamic_cast<FSDPUnitImpl*>(sharded.units[u].module)) {
      declared->attach(hooks);
    } else {
      set_forward_hooks(*sharded.units[u].module, hooks);
      sharded.units[u].via_call = true;
    }
    sharded.hooks.push_back(std::move(hooks));
    hook_accumulators(sharded, u);
  }
}

// The unit reduces once its last gradient arrived: a post-hook on each parameter's AccumulateGrad.
// Autograd makes a new AccumulateGrad when set_data changes a parameter's dtype (a gather in the
// param dtype after one in the shards' dtype), so this runs again before every forward. An
// AccumulateGrad keeps the shape its parameter had when it was made: only full parameters get one
// (one materialised from the meta device holds 0 elements until its first gather).
void FSDPStrategy::Engine::hook_accumulators(ShardedModule& sharded, size_t u) {
  for (size_t i : sharded.units[u].parameters) {
    ShardedParameter& p = sharded.parameters[i];
    if (!p.parameter.requires_grad() || p.parameter.numel() != p.numel) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(p.parameter);
    if (accumulator == p.accumulator) continue;
    p.accumulator = std::move(accumulator);
    p.accumulator->add_post_hook(std::make_unique<AfterAccumulation>([this, &sharded, u] {
      Unit& unit = sharded.units[u];
      if (unit.pending > 0 && --unit.pending == 0) finish_unit_backward(sharded, unit);
    }));
  }
}

void FSDPStrategy::setup_optimizer(torch::optim::Optimizer& optimizer) { engine_->adopt_optimizer(optimizer); }

void FSDPStrategy::Engine::adopt_optimizer(torch::optim::Optimizer& optimizer) {
  LF_CHECK(optimizer.state().empty(), ValueError, "fsdp: this optimizer has already stepped; its state belongs to the ",
           "full parameters. Build the optimizer after setup_module(model), and set it up before the first step.");
  for (auto& group : optimizer.param_groups()) {
    for (auto& parameter : group.params()) {
      const ShardedParameter* found = nullptr;
      for (const auto& sharded : modules_) {
        for (const auto& p : sharded->parameters) {
          if (p.parameter.unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl()) found = &p;
        }
      }
      LF_CHECK(found != nullptr, ValueError, "fsdp: the optimizer holds a parameter that no set-up module owns. ",
               "Set the module up first (fabric.setup(model, optimizer) or setup_module), with the optimizer built ",
               "over that module's parameters.");
      parameter = found->shard;
    }
  }
}

FSDPStrategy::Engine::ShardedModule* FSDPStrategy::Engine::find(const torch::nn::Module& module) {
  for (auto& sharded : modules_) {
    if (sharded->address == &module && !sharded->module.expired()) return sharded.get();
  }
  return nullptr;
}

const FSDPStrategy::Engine::ShardedParameter* FSDPStrategy::Engine::find_shard(const at::Tensor& shard) const {
  auto found = by_shard_.find(shard.unsafeGetTensorImpl());
  return found == by_shard_.end() ? nullptr : found->second;
}

void FSDPStrategy::Engine::free_full_parameters(ShardedModule& sharded, Unit& unit) {
  for (size_t i : unit.parameters) {
    ShardedParameter& p = sharded.parameters[i];
    if (p.held) release_storage(p.held);
    p.held = c10::Storage();
    p.parameter.set_data(at::empty({0}, p.parameter.options()));
  }
  unit.materialized = false;
  unit.released = false;
}

void FSDPStrategy::Engine::release_full_parameters(ShardedModule& sharded, Unit& unit) {
  for (size_t i : unit.parameters) {
    ShardedParameter& p = sharded.parameters[i];
    p.held = p.parameter.storage();
    release_storage(p.held);
    p.parameter.set_data(at::empty({0}, p.parameter.options()));  // reads see an empty tensor, not freed memory
  }
  unit.materialized = false;
  unit.released = true;
}

bool FSDPStrategy::Engine::needs_gather(const ShardedModule& sharded, const Unit& unit) const {
  const bool shards_are_full = strategy_.fsdp_options_.sharding_strategy == ShardingStrategy::NoShard && !sharded.casts;
  return !unit.parameters.empty() && !shards_are_full && (!unit.materialized || unit.stale || unit.released);
}

void FSDPStrategy::Engine::gather(ShardedModule& sharded, Unit& unit, bool full_precision) {
  const bool prefetched = prefetch_ && prefetch_->sharded == &sharded && &sharded.units[prefetch_->unit] == &unit;
  // A prefetch of this unit puts its values in place; any other is dropped (ops stay in issue order).
  if (settle_prefetch(/*use=*/prefetched && !full_precision)) return;
  if ((strategy_.fsdp_options_.sharding_strategy == ShardingStrategy::NoShard && !sharded.casts) ||
      unit.parameters.empty()) {
    unit.stale = false;  // NO_SHARD without a cast: the shards are the full parameters
    return;
  }
  const int parts = strategy_.shard_group_size();
  const at::Tensor local = pack_shards(sharded, unit, full_precision);
  const at::Tensor gathered = parts > 1 ? strategy_.shard_group().all_gather(local) : local.view({1, local.numel()});
  place(sharded, unit, gathered, full_precision);
}

at::Tensor FSDPStrategy::Engine::pack_shards(const ShardedModule& sharded, const Unit& unit, bool full_precision) const {
  torch::NoGradGuard no_grad;
  int64_t slots = 0;
  for (size_t i : unit.parameters) slots += sharded.parameters[i].chunk;
  const ShardedParameter& first = sharded.parameters[unit.parameters.front()];
  at::Tensor local = torch::zeros({slots}, first.shard.options().dtype(full_dtype(first, full_precision)));
  int64_t offset = 0;
  for (size_t i : unit.parameters) {
    const ShardedParameter& p = sharded.parameters[i];
    LF_CHECK(p.shard.scalar_type() == first.shard.scalar_type(), ValueError, "fsdp: parameter ", p.name, " is ",
             c10::toString(p.shard.scalar_type()), " but others of its unit are ", c10::toString(first.shard.scalar_type()),
             "; one dtype per sharding unit is supported (wrap the others in an FSDPUnit of their own).");
    local.narrow(0, offset, p.slice.length).copy_(p.shard);  // cast to the param dtype, if any
    offset += p.chunk;
  }
  return local;
}

void FSDPStrategy::Engine::place(ShardedModule& sharded, Unit& unit, const at::Tensor& gathered, bool full_precision) {
  torch::NoGradGuard no_grad;
  const int parts = strategy_.shard_group_size();
  int64_t offset = 0;
  for (size_t i : unit.parameters) {
    ShardedParameter& p = sharded.parameters[i];
    const auto options = p.shard.options().dtype(full_dtype(p, full_precision));
    if (unit.released) {  // back into the storage autograd saved, with the full shape
      restore_storage(p.held, static_cast<size_t>(p.numel) * c10::elementSize(full_dtype(p, full_precision)));
      p.parameter.set_data(at::empty({0}, options).set_(p.held, 0, p.shape, contiguous_strides(p.shape)));
      p.held = c10::Storage();
    } else if (!unit.materialized || p.parameter.scalar_type() != full_dtype(p, full_precision) || p.parameter.numel() != p.numel) {
      p.parameter.set_data(at::empty(p.shape, options));
    }
    // Row r of the gathered buffer holds part r's chunk: copied straight into place, no temporary.
    // .data(): a fresh version counter, so the tensors autograd saved stay valid.
    at::Tensor flat = p.parameter.data().view(-1);
    for (int r = 0; r < parts; ++r) {
      const ShardSlice held = shard_slice(p.numel, parts, r);
      if (held.length > 0) flat.narrow(0, held.begin, held.length).copy_(gathered[r].narrow(0, offset, held.length));
    }
    offset += p.chunk;
  }
  unit.materialized = true;
  unit.released = false;
  unit.stale = false;
}

void FSDPStrategy::Engine::prefetch(ShardedModule& sharded, size_t u) {
  Unit& unit = sharded.units[u];
  if (prefetch_ && prefetch_->sharded == &sharded && prefetch_->unit == u) return;
  if (!needs_gather(sharded, unit) || strategy_.shard_group_size() < 2) return;
  settle_prefetch(/*use=*/false);
  prefetch_ = Prefetch{&sharded, u, shard_version_, strategy_.shard_group().all_gather_start(pack_shards(sharded, unit, false))};
}

bool FSDPStrategy::Engine::settle_prefetch(bool use) {
  if (!prefetch_) return false;
  Prefetch pending = std::move(*prefetch_);
  prefetch_.reset();
  const at::Tensor gathered = pending.finish();
  Unit& unit = pending.sharded->units[pending.unit];
  if (!use || pending.version != shard_version_ || !needs_gather(*pending.sharded, unit)) return false;
  place(*pending.sharded, unit, gathered, /*full_precision=*/false);
  return true;
}

std::optional<size_t> FSDPStrategy::Engine::neighbour(const ShardedModule& sharded, size_t unit, bool forward) const {
  const std::vector<size_t>& order = forward ? sharded.last_order : sharded.order;
  const auto at = std::find(order.begin(), order.end(), unit);
  if (at == order.end()) return std::nullopt;
  if (forward) return at + 1 == order.end() ? std::nullopt : std::optional<size_t>(*(at + 1));
  return at == order.begin() ? std::nullopt : std::optional<size_t>(*(at - 1));
}

void FSDPStrategy::before_forward(const torch::nn::Module& module) { engine_->before_forward(module); }

void FSDPStrategy::Engine::before_forward(const torch::nn::Module& module) {
  ShardedModule* sharded = find(module);
  if (sharded == nullptr) return;
  for (auto& unit : sharded->units) unit.reduced = false, unit.entered = false;
  settle_prefetch(/*use=*/false);
  sharded->last_order = std::move(sharded->order);
  sharded->order.clear();
  sharded->in_forward = true;
  // A no-grad forward (a metric) between a forward and its backward leaves the flag set.
  sharded->awaiting_backward = sharded->awaiting_backward || torch::GradMode::is_enabled();
  Unit& own = sharded->units.front();
  if (!own.materialized || own.stale) gather(*sharded, own);
}

void FSDPStrategy::Engine::unit_before_forward(ShardedModule& sharded, Unit& unit) {
  unit.entered = true;
  const auto u = static_cast<size_t>(&unit - sharded.units.data());
  if (sharded.in_forward) sharded.order.push_back(u);
  if (!unit.materialized || unit.stale) gather(sharded, unit);
  if (sharded.in_forward && strategy_.fsdp_options_.forward_prefetch) {
    if (const auto next = neighbour(sharded, u, /*forward=*/true)) prefetch(sharded, *next);
  }
  hook_accumulators(sharded, u);
  unit.pending = 0;
  if (torch::GradMode::is_enabled()) {
    for (size_t i : unit.parameters) unit.pending += sharded.parameters[i].parameter.requires_grad() ? 1 : 0;
  }
}

at::Tensor FSDPStrategy::Engine::unit_after_forward(ShardedModule& sharded, Unit& unit, at::Tensor output) {
  // keep_full_: a gradient's graph saved these parameters. (Releasing would also work as long as
  // the backward reaches this output's hook before the nodes of that graph, which autograd's
  // ordering gives on one device thread; keeping them does not depend on it.)
  if (!frees_parameters() || keep_full_) return output;
  if (!output.requires_grad()) {
    // Tensors an earlier forward's graph saved share these parameters: give the memory back
    // but keep the storage for its backward to refill.
    if (sharded.awaiting_backward) {
      release_full_parameters(sharded, unit);
    } else {
      free_full_parameters(sharded, unit);
    }
    return output;
  }
  release_full_parameters(sharded, unit);
  // When the backward reaches this output, the unit's parameters are gathered again into the
  // same storage, before any of its gradient functions runs.
  // The unit the backward reaches next (the one before it in this forward) is prefetched then.
  output.register_hook([this, &sharded, &unit](const at::Tensor&) {
    if (unit.released) gather(sharded, unit);
    if (!strategy_.fsdp_options_.backward_prefetch) return;
    const auto previous = neighbour(sharded, static_cast<size_t>(&unit - sharded.units.data()), /*forward=*/false);
    if (previous) prefetch(sharded, *previous);
  });
  return output;
}

void FSDPStrategy::Engine::finish_unit_backward(ShardedModule& sharded, Unit& unit) {
  if (unit.reduced) return;
  // Parameters first: the reduction needs only the gradients, so both are never full at once
  // with the communication buffer.
  if (frees_parameters() && !keep_full_) free_full_parameters(sharded, unit);
  if (strategy_.syncs_gradients_of(sharded.address)) reduce_gradients(sharded, unit);  // else full gradients accumulate (no_backward_sync)
  unit.reduced = true;
}

void FSDPStrategy::Engine::reduce_gradients(ShardedModule& sharded, Unit& unit) {
  torch::NoGradGuard no_grad;
  if (unit.parameters.empty()) return;
  const int parts = strategy_.shard_group_size();
  // Row r holds every parameter's chunk r (padded to the chunk size), so one reduce-scatter over
  // the shard group leaves each rank the sum of its own chunks.
  int64_t slots = 0;
  for (size_t i : unit.parameters) slots += sharded.parameters[i].chunk;
  // In the reduce dtype (copy_ casts each gradient into it); added to the shards' gradients in theirs.
  const at::Tensor& first_shard = sharded.parameters[unit.parameters.front()].shard;
  const c10::ScalarType reduce_dtype = dtypes_.reduce_dtype && c10::isFloatingType(first_shard.scalar_type())
                                           ? *dtypes_.reduce_dtype : first_shard.scalar_type();
  at::Tensor rows = torch::zeros({parts, slots}, first_shard.options().dtype(reduce_dtype));
  int64_t offset = 0;
  for (size_t i : unit.parameters) {
    ShardedParameter& p = sharded.parameters[i];
    const at::Tensor grad = p.parameter.grad();
    if (grad.defined()) {
      const at::Tensor flat = grad.reshape(-1);
      for (int r = 0; r < parts; ++r) {
        const ShardSlice slice = shard_slice(p.numel, parts, r);
        if (slice.length > 0) rows[r].narrow(0, offset, slice.length).copy_(flat.narrow(0, slice.begin, slice.length));
      }
      p.parameter.mutable_grad() = at::Tensor();  // copied: the full gradient is not needed any more
    }
    offset += p.chunk;
  }
  const int world = strategy_.data_group().world_size();  // the replicas averaged
  // float16 sums overflow soon: divide partly before the reduction and the rest after (Python's
  // pre- and post-divide factors); other dtypes divide once, after.
  const double pre = reduce_dtype == at::kHalf ? std::sqrt(static_cast<double>(world)) : 1.0;
  if (pre != 1.0) rows.div_(pre);
  at::Tensor mine = parts > 1 ? strategy_.shard_group().reduce_scatter(rows, ReduceOp::Sum) : rows[0].clone();
  Collective* replicas = strategy_.replica_group();
  // NO_SHARD: DDP. HYBRID_SHARD with one rank per shard group averages over its replicas below.
  if (parts == 1 && world > 1 && replicas == nullptr) strategy_.data_group().all_reduce_(mine, ReduceOp::Sum);
  if (replicas != nullptr && replicas->world_size() > 1) replicas->all_reduce_(mine, ReduceOp::Sum);
  mine.div_(static_cast<double>(world) / pre);
  offset = 0;
  for (size_t i : unit.parameters) {
    ShardedParameter& p = sharded.parameters[i];
    if (!only_.empty() && only_.count(p.parameter.unsafeGetTensorImpl()) == 0) {
      offset += p.chunk;  // outside the backward's inputs: its gradient stays as it was
      continue;
    }
    const at::Tensor slice = mine.narrow(0, offset, p.slice.length);
    if (p.shard.grad().defined()) {
      p.shard.mutable_grad().add_(slice);
    } else {
      p.shard.mutable_grad() = slice.to(p.shard.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    }
    offset += p.chunk;
  }
}

void FSDPStrategy::backward(at::Tensor& loss, torch::nn::Module* module, const BackwardOptions& options) {
  LF_CHECK(!options.create_graph, ValueError, "fabric.backward(loss, BackwardOptions().higher_order()): strategy=\"fsdp\" "
           "reduce-scatters each unit's gradients and frees them as they arrive, which a graph of the backward cannot "
           "follow (PyTorch's FSDP does not support it either). For a gradient penalty or a meta-learning inner step, "
           "take the gradient with fabric.grad(outputs, inputs, GradOptions().higher_order()), build the penalty from "
           "it, and call fabric.backward on the loss that includes it (docs/user-guide.md, \"Gradient penalties and "
           "double backward\").");
  engine_->end_forwards();
  engine_->begin_backward(options);
  Strategy::backward(loss, module, options);
  engine_->finish_backward();
}

void FSDPStrategy::before_grad(bool create_graph) {
  if (create_graph) engine_->keep_full_parameters();
}

void FSDPStrategy::Engine::begin_backward(const BackwardOptions& options) {
  only_.clear();
  for (const auto& tensor : options.inputs) only_.insert(tensor.unsafeGetTensorImpl());
  retaining_ = options.retain_graph.value_or(options.create_graph);
  if (retaining_) keep_full_ = true;
}

void FSDPStrategy::Engine::end_forwards() {
  for (auto& sharded : modules_) sharded->in_forward = false;  // recomputes in backward are not the forward's order
}

void FSDPStrategy::Engine::finish_backward() {
  settle_prefetch(/*use=*/false);
  const bool retained = retaining_;
  retaining_ = false;
  only_.clear();
  for (auto& sharded : modules_) {  // units the backward did not finish (unit 0, unused parameters), in order
    if (sharded->module.expired()) continue;
    sharded->awaiting_backward = retained;
    const std::string skipped = skipped_units_hint(*sharded->address, /*after_backward=*/true);
    LF_CHECK(skipped.empty(), RuntimeError, skipped);
    for (auto& unit : sharded->units) {
      finish_unit_backward(*sharded, unit);
      unit.reduced = false;
      unit.pending = 0;
      if (!retained) continue;
      // The retained graph's next backward owes every gradient again.
      for (size_t i : unit.parameters) unit.pending += sharded->parameters[i].parameter.requires_grad() ? 1 : 0;
    }
  }
  if (retained || !keep_full_) return;
  keep_full_ = false;
  if (!frees_parameters()) return;
  for (auto& sharded : modules_) {
    if (sharded->module.expired()) continue;
    for (auto& unit : sharded->units) {
      if (unit.materialized || unit.released) free_full_parameters(*sharded, unit);
    }
  }
}

bool FSDPStrategy::optimizer_step(torch::optim::Optimizer& optimizer,
                                  const torch::optim::Optimizer::LossClosure& closure, StepKernel kernel) {
  const bool stepped = Strategy::optimizer_step(optimizer, closure, kernel);
  engine_->mark_stale();
  return stepped;
}

ScopeGuard FSDPStrategy::summon_full_parameters(const torch::nn::Module& module) { return engine_->summon(module); }

std::vector<FSDPStrategy::LocalShard> FSDPStrategy::local_shards(const torch::nn::Module& module) {
  Engine::ShardedModule* sharded = engine_->find(module);
  LF_CHECK(sharded != nullptr, ValueError, "local_shards: this module was not set up with strategy=\"fsdp\". Pass the "
           "module given to fabric.setup.");
  std::vector<LocalShard> shards;
  for (const auto& parameter : sharded->parameters) {
    shards.push_back({parameter.name, parameter.shape, parameter.slice.begin, parameter.shard});
  }
  return shards;
}

at::Tensor FSDPStrategy::gather_full(const LocalShard& parameter, const at::Tensor& values) {
  const int64_t numel = c10::multiply_integers(parameter.shape);
  LF_CHECK(values.numel() == parameter.shard.numel(), ValueError, "gather_full: ", values.numel(), " values for ",
           parameter.name, ", whose shard on this rank holds ", parameter.shard.numel(), ".");
  const int parts = shard_group_size();
  if (parts == 1) return values.reshape(parameter.shape).clone();
  at::Tensor slot = at::zeros({(numel + parts - 1) / parts}, values.options());
  slot.narrow(0, 0, values.numel()).copy_(values.reshape(-1));
  return shard_group().all_gather(slot).reshape(-1).narrow(0, 0, numel).view(parameter.shape).clone();
}

void FSDPStrategy::shards_changed() { engine_->mark_stale(); }

std::vector<std::pair<std::string, at::Tensor>> FSDPStrategy::trained_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& part : local_shards(module)) tensors.emplace_back(part.name, part.shard);
  return tensors;
}

at::Tensor FSDPStrategy::parameter_of(const at::Tensor& tensor) const {
  const auto* p = engine_->find_parameter(tensor);
  return p != nullptr ? p->parameter : at::Tensor();
}

CheckpointLayout* FSDPStrategy::placements() { return engine_.get(); }

ScopeGuard FSDPStrategy::Engine::summon(const torch::nn::Module& module) {
  ShardedModule* sharded = find(module);
  LF_CHECK(sharded != nullptr, ValueError, "summon_full_parameters: this module was not set up with strategy=\"fsdp\". ",
           "Pass the module given to fabric.setup.");
  bool released = false;
  for (const auto& unit : sharded->units) released |= unit.released;
  LF_CHECK(!released && !sharded->awaiting_backward, RuntimeError, "summon_full_parameters: a forward of this module "
           "with gradients has run and its fabric.backward has not: the parameters autograd saved for that backward "
           "are in use, and gathering or freeing them would break it. Call it before the forward, after "
           "fabric.backward, or run that forward under torch::NoGradGuard.");
  settle_prefetch(/*use=*/false);
  // In the shards' own dtype: the master values, whatever the param dtype.
  for (auto& unit : sharded->units) {
    if (!unit.materialized || unit.stale || unit.released || sharded->casts) gather(*sharded, unit, /*full_precision=*/true);
  }
  if (!frees_parameters() && !sharded->casts) return ScopeGuard();
  return ScopeGuard([this, sharded] {
    for (auto& unit : sharded->units) {
      if (frees_parameters()) {
        free_full_parameters(*sharded, unit);
      } else {
        unit.stale = true;  // the next forward gathers in the param dtype again
      }
    }
  });
}

void FSDPStrategy::Engine::mark_stale() {
  settle_prefetch(/*use=*/false);  // gathered from the shards before this step
  ++shard_version_;
  for (auto& sharded : modules_) {
    for (auto& unit : sharded->units) unit.stale = true;
  }
}

int64_t FSDPStrategy::resident_bytes() const { return engine_->resident_bytes(); }

int64_t FSDPStrategy::Engine::resident_bytes() const {
  int64_t bytes = 0;
  auto size_of = [](const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; };
  for (const auto& sharded : modules_) {
    for (const auto& p : sharded->parameters) {
      bytes += size_of(p.parameter) + size_of(p.parameter.grad()) + size_of(p.shard.grad());
      if (!p.shard.is_alias_of(p.parameter)) bytes += size_of(p.shard);
    }
  }
  return bytes;
}

}  // namespace lightning::fabric
