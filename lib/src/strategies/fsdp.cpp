#include "lightning/fabric/strategies/fsdp.h"

#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include <cmath>
#include <unistd.h>

#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/checkpoint/sharded.h"
#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

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
  LF_CHECK(options.timeout.count() > 0, ValueError, "FSDPOptions: timeout must be positive.");
  LF_CHECK(options.hang_timeout.count() >= 0, ValueError, "FSDPOptions: hang_timeout=", options.hang_timeout.count(),
           " ms must be 0 (off) or positive (default 5 minutes).");
  check_process_group_backend("FSDPOptions: process_group_backend", options.process_group_backend);
  return StrategySpec{"fsdp", [options](StrategyContext context) -> std::shared_ptr<Strategy> {
                        return std::make_shared<FSDPStrategy>(std::move(context), options);
                      }};
}

struct FSDPStrategy::ShardedParameter {
  std::string name;
  at::Tensor parameter;  // the module's own parameter: full while materialized, else 0 elements
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t chunk = 0;   // ceil(numel / parts): the padded slot size in communication buffers
  ShardSlice slice;    // this rank's part
  at::Tensor shard;    // 1-D, slice.length elements: what the optimizer steps
  std::shared_ptr<torch::autograd::Node> accumulator;  // kept alive: it carries the unit's hook
  c10::Storage held;   // while released: the full parameter's storage, which autograd still refers to
};

// A sharding unit: the parameters gathered, given back and reduced together. Unit 0 holds the
// set-up module's parameters that no FSDPUnit inside it claims.
struct FSDPStrategy::Unit {
  FSDPUnitImpl* module = nullptr;  // nullptr for unit 0
  std::vector<size_t> parameters;  // indices into ShardedModule::parameters
  bool materialized = true;  // full parameters present
  bool stale = false;        // shards stepped since the last gather
  bool released = false;     // storage given back after the forward; shapes kept for autograd
  bool reduced = false;      // gradients reduced during the current backward
  size_t pending = 0;        // gradient accumulations the current backward still owes
};

struct FSDPStrategy::ShardedModule {
  const torch::nn::Module* address = nullptr;
  std::weak_ptr<torch::nn::Module> module;
  std::vector<ShardedParameter> parameters;
  std::vector<Unit> units;
  std::vector<std::shared_ptr<FSDPUnitImpl::Hooks>> hooks;  // one per FSDPUnit (weakly held there)
};

namespace {
DDPOptions ddp_options_for(const FSDPOptions& options) {
  DDPOptions ddp;
  ddp.name = "fsdp";
  ddp.timeout = options.timeout;
  ddp.rendezvous_timeout = options.rendezvous_timeout;
  ddp.hang_timeout = options.hang_timeout;
  ddp.process_group_backend = options.process_group_backend;
  return ddp;
}

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

class FSDPStrategy::UnitHooks : public FSDPUnitImpl::Hooks {
 public:
  UnitHooks(FSDPStrategy& strategy, ShardedModule& sharded, size_t unit)
      : strategy_(strategy), sharded_(sharded), unit_(unit) {}
  void before_forward() override { strategy_.unit_before_forward(sharded_, sharded_.units[unit_]); }
  at::Tensor after_forward(at::Tensor output) override {
    return strategy_.unit_after_forward(sharded_, sharded_.units[unit_], std::move(output));
  }

 private:
  FSDPStrategy& strategy_;
  ShardedModule& sharded_;
  size_t unit_;
};

FSDPStrategy::FSDPStrategy(StrategyContext context, FSDPOptions options)
    : DDPStrategy(std::move(context), ddp_options_for(options)), fsdp_options_(std::move(options)) {}

FSDPStrategy::~FSDPStrategy() = default;

int FSDPStrategy::shard_group_size() const {
  switch (fsdp_options_.sharding_strategy) {
    case ShardingStrategy::NoShard: return 1;
    case ShardingStrategy::HybridShard: return num_processes();
    default: return world_size();
  }
}

int FSDPStrategy::shard_group_rank() const {
  switch (fsdp_options_.sharding_strategy) {
    case ShardingStrategy::NoShard: return 0;
    case ShardingStrategy::HybridShard: return global_rank() % num_processes();
    default: return global_rank();
  }
}

bool FSDPStrategy::frees_parameters() const {
  return fsdp_options_.sharding_strategy == ShardingStrategy::FullShard ||
         fsdp_options_.sharding_strategy == ShardingStrategy::HybridShard;
}

void FSDPStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  setup_environment();
  if (const auto scaler = precision()->loss_scaler()) {  // each rank checks only its own shards for inf/NaN
    scaler->set_found_inf_reducer([this](at::Tensor& found_inf) { collective().all_reduce_(found_inf, ReduceOp::Max); });
  }
  if (fsdp_options_.sharding_strategy == ShardingStrategy::HybridShard && !shard_group_) {
    const int local = num_processes(), node = global_rank() / local;
    std::vector<int> node_ranks, replica_ranks;
    for (int r = 0; r < local; ++r) node_ranks.push_back(node * local + r);
    for (int n = 0; n < world_size() / local; ++n) replica_ranks.push_back(n * local + global_rank() % local);
    shard_group_ = std::make_shared<Collective>(collective(), "fsdp-node-" + std::to_string(node), node_ranks);
    replica_group_ = std::make_shared<Collective>(collective(), "fsdp-replica-" + std::to_string(global_rank() % local),
                                                  replica_ranks);
  }
  if (fsdp_options_.auto_wrap_min_params > 0) wrap_sequential_children(*module, fsdp_options_.auto_wrap_min_params);
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> state = module->parameters();
  for (auto& buffer : module->buffers()) state.push_back(buffer);
  collective().check_same_tensors(state, "The model passed to fabric.setup");
  for (auto& parameter : module->parameters()) {
    at::Tensor data = parameter.data();
    collective().broadcast_(data, 0);
  }
  for (auto& buffer : module->buffers()) collective().broadcast_(buffer, 0);

  auto sharded = std::make_unique<ShardedModule>();
  sharded->address = module.get();
  sharded->module = module;
  const int parts = shard_group_size(), part = shard_group_rank();
  for (const auto& item : module->named_parameters(true)) {
    ShardedParameter p;
    p.name = item.key();
    p.parameter = item.value();
    p.shape = item.value().sizes().vec();
    p.numel = item.value().numel();
    p.chunk = (p.numel + parts - 1) / parts;
    p.slice = shard_slice(p.numel, parts, part);
    at::Tensor flat = p.parameter.detach().view(-1).narrow(0, p.slice.begin, p.slice.length);
    // FULL_SHARD and HYBRID_SHARD keep the shard in its own memory (the full parameter is freed);
    // SHARD_GRAD_OP and NO_SHARD step a view of the full parameter in place.
    p.shard = frees_parameters() ? flat.clone() : flat;
    sharded->parameters.push_back(std::move(p));
  }
  build_units(*sharded, *module);
  for (auto& unit : sharded->units) {
    if (frees_parameters()) free_full_parameters(*sharded, unit);
  }
  modules_.push_back(std::move(sharded));
}

void FSDPStrategy::build_units(ShardedModule& sharded, torch::nn::Module& module) {
  std::map<const c10::TensorImpl*, size_t> index_of;
  for (size_t i = 0; i < sharded.parameters.size(); ++i) index_of[sharded.parameters[i].parameter.unsafeGetTensorImpl()] = i;
  std::vector<FSDPUnitImpl*> unit_modules;
  for (const auto& child : module.modules(/*include_self=*/false)) {
    if (auto* unit = dynamic_cast<FSDPUnitImpl*>(child.get())) unit_modules.push_back(unit);
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
  for (size_t u = 0; u < unit_modules.size(); ++u) sharded.units[u + 1].module = unit_modules[u];
  for (size_t i = 0; i < sharded.parameters.size(); ++i) sharded.units[static_cast<size_t>(owner[i])].parameters.push_back(i);
  for (size_t u = 1; u < sharded.units.size(); ++u) {
    auto hooks = std::make_shared<UnitHooks>(*this, sharded, u);
    sharded.units[u].module->attach(hooks);
    sharded.hooks.push_back(std::move(hooks));
    for (size_t i : sharded.units[u].parameters) {  // the unit reduces once its last gradient arrived
      ShardedParameter& p = sharded.parameters[i];
      if (!p.parameter.requires_grad()) continue;
      p.accumulator = torch::autograd::impl::grad_accumulator(p.parameter);
      p.accumulator->add_post_hook(std::make_unique<AfterAccumulation>([this, &sharded, u] {
        Unit& unit = sharded.units[u];
        if (unit.pending > 0 && --unit.pending == 0) finish_unit_backward(sharded, unit);
      }));
    }
  }
}

void FSDPStrategy::setup_optimizer(torch::optim::Optimizer& optimizer) {
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

FSDPStrategy::ShardedModule* FSDPStrategy::find(const torch::nn::Module& module) {
  for (auto& sharded : modules_) {
    if (sharded->address == &module && !sharded->module.expired()) return sharded.get();
  }
  return nullptr;
}

const FSDPStrategy::ShardedParameter* FSDPStrategy::find_shard(const at::Tensor& shard) const {
  for (const auto& sharded : modules_) {
    for (const auto& p : sharded->parameters) {
      if (p.shard.unsafeGetTensorImpl() == shard.unsafeGetTensorImpl()) return &p;
    }
  }
  return nullptr;
}

bool FSDPStrategy::syncing(const ShardedModule& sharded) const { return sync_disabled_.count(sharded.address) == 0; }

void FSDPStrategy::free_full_parameters(ShardedModule& sharded, Unit& unit) {
  for (size_t i : unit.parameters) {
    ShardedParameter& p = sharded.parameters[i];
    if (p.held) release_storage(p.held);
    p.held = c10::Storage();
    p.parameter.set_data(at::empty({0}, p.parameter.options()));
  }
  unit.materialized = false;
  unit.released = false;
}

void FSDPStrategy::release_full_parameters(ShardedModule& sharded, Unit& unit) {
  for (size_t i : unit.parameters) {
    ShardedParameter& p = sharded.parameters[i];
    p.held = p.parameter.storage();
    release_storage(p.held);
    p.parameter.set_data(at::empty({0}, p.parameter.options()));  // reads see an empty tensor, not freed memory
  }
  unit.materialized = false;
  unit.released = true;
}

void FSDPStrategy::gather(ShardedModule& sharded, Unit& unit) {
  torch::NoGradGuard no_grad;
  const int parts = shard_group_size();
  if (fsdp_options_.sharding_strategy == ShardingStrategy::NoShard || unit.parameters.empty()) {
    unit.stale = false;  // NO_SHARD: the shards are the full parameters
    return;
  }
  int64_t slots = 0;
  for (size_t i : unit.parameters) slots += sharded.parameters[i].chunk;
  at::Tensor local = torch::zeros({slots}, sharded.parameters[unit.parameters.front()].shard.options());
  int64_t offset = 0;
  for (size_t i : unit.parameters) {
    const ShardedParameter& p = sharded.parameters[i];
    LF_CHECK(p.shard.scalar_type() == local.scalar_type(), ValueError, "fsdp: parameter ", p.name, " is ",
             c10::toString(p.shard.scalar_type()), " but others of its unit are ", c10::toString(local.scalar_type()),
             "; one dtype per sharding unit is supported (wrap the others in an FSDPUnit of their own).");
    local.narrow(0, offset, p.slice.length).copy_(p.shard);
    offset += p.chunk;
  }
  Collective& group = shard_group_ ? *shard_group_ : collective();
  const at::Tensor gathered = parts > 1 ? group.all_gather(local) : local.view({1, slots});  // [parts, slots]
  offset = 0;
  for (size_t i : unit.parameters) {
    ShardedParameter& p = sharded.parameters[i];
    if (unit.released) {  // back into the storage autograd saved, with the full shape
      restore_storage(p.held, static_cast<size_t>(p.numel) * p.shard.element_size());
      p.parameter.set_data(at::empty({0}, p.parameter.options()).set_(p.held, 0, p.shape, contiguous_strides(p.shape)));
      p.held = c10::Storage();
    } else if (!unit.materialized) {
      p.parameter.set_data(at::empty(p.shape, p.shard.options()));
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

void FSDPStrategy::before_forward(const torch::nn::Module& module) {
  ShardedModule* sharded = find(module);
  if (sharded == nullptr) return;
  for (auto& unit : sharded->units) unit.reduced = false;
  Unit& own = sharded->units.front();
  if (!own.materialized || own.stale) gather(*sharded, own);
}

void FSDPStrategy::unit_before_forward(ShardedModule& sharded, Unit& unit) {
  if (!unit.materialized || unit.stale) gather(sharded, unit);
  unit.pending = 0;
  if (torch::GradMode::is_enabled()) {
    for (size_t i : unit.parameters) unit.pending += sharded.parameters[i].parameter.requires_grad() ? 1 : 0;
  }
}

at::Tensor FSDPStrategy::unit_after_forward(ShardedModule& sharded, Unit& unit, at::Tensor output) {
  if (!frees_parameters()) return output;
  if (!output.requires_grad()) {
    free_full_parameters(sharded, unit);
    return output;
  }
  release_full_parameters(sharded, unit);
  // When the backward reaches this output, the unit's parameters are gathered again into the
  // same storage, before any of its gradient functions runs.
  output.register_hook([this, &sharded, &unit](const at::Tensor&) {
    if (unit.released) gather(sharded, unit);
  });
  return output;
}

void FSDPStrategy::finish_unit_backward(ShardedModule& sharded, Unit& unit) {
  if (unit.reduced) return;
  // Parameters first: the reduction needs only the gradients, so both are never full at once
  // with the communication buffer.
  if (frees_parameters()) free_full_parameters(sharded, unit);
  if (syncing(sharded)) reduce_gradients(sharded, unit);  // else full gradients accumulate (no_backward_sync)
  unit.reduced = true;
}

void FSDPStrategy::reduce_gradients(ShardedModule& sharded, Unit& unit) {
  torch::NoGradGuard no_grad;
  if (unit.parameters.empty()) return;
  const int parts = shard_group_size();
  // Row r holds every parameter's chunk r (padded to the chunk size), so one reduce-scatter over
  // the shard group leaves each rank the sum of its own chunks.
  int64_t slots = 0;
  for (size_t i : unit.parameters) slots += sharded.parameters[i].chunk;
  at::Tensor rows = torch::zeros({parts, slots}, sharded.parameters[unit.parameters.front()].shard.options());
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
  Collective& group = shard_group_ ? *shard_group_ : collective();
  at::Tensor mine = parts > 1 ? group.reduce_scatter_rows(rows) : rows[0].clone();
  if (parts == 1 && world_size() > 1) collective().all_reduce_(mine, ReduceOp::Sum);  // NO_SHARD: DDP
  if (replica_group_ && replica_group_->world_size() > 1) replica_group_->all_reduce_(mine, ReduceOp::Sum);
  mine.div_(world_size());
  offset = 0;
  for (size_t i : unit.parameters) {
    ShardedParameter& p = sharded.parameters[i];
    const at::Tensor slice = mine.narrow(0, offset, p.slice.length);
    if (p.shard.grad().defined()) {
      p.shard.mutable_grad().add_(slice);
    } else {
      p.shard.mutable_grad() = slice.clone();
    }
    offset += p.chunk;
  }
}

void FSDPStrategy::backward(at::Tensor& loss, torch::nn::Module* module) {
  Strategy::backward(loss, module);
  for (auto& sharded : modules_) {  // units the backward did not finish (unit 0, unused parameters), in order
    if (sharded->module.expired()) continue;
    for (auto& unit : sharded->units) {
      finish_unit_backward(*sharded, unit);
      unit.reduced = false;
      unit.pending = 0;
    }
  }
}

bool FSDPStrategy::optimizer_step(torch::optim::Optimizer& optimizer,
                                  const torch::optim::Optimizer::LossClosure& closure) {
  const bool stepped = Strategy::optimizer_step(optimizer, closure);
  mark_stale();
  return stepped;
}

ScopeGuard FSDPStrategy::summon_full_parameters(const torch::nn::Module& module) {
  ShardedModule* sharded = find(module);
  LF_CHECK(sharded != nullptr, ValueError, "summon_full_parameters: this module was not set up with strategy=\"fsdp\". ",
           "Pass the module given to fabric.setup.");
  for (auto& unit : sharded->units) {
    if (!unit.materialized || unit.stale || unit.released) gather(*sharded, unit);
  }
  if (!frees_parameters()) return ScopeGuard();
  return ScopeGuard([this, sharded] {
    for (auto& unit : sharded->units) free_full_parameters(*sharded, unit);
  });
}

void FSDPStrategy::mark_stale() {
  for (auto& sharded : modules_) {
    for (auto& unit : sharded->units) unit.stale = true;
  }
}

double FSDPStrategy::clip_gradients_by_norm(const std::vector<at::Tensor>& parameters, double max_norm,
                                            double norm_type, bool error_if_nonfinite) {
  torch::NoGradGuard no_grad;
  const bool infinity = std::isinf(norm_type);
  at::Tensor local = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(root_device()));
  for (const auto& parameter : parameters) {
    if (!parameter.grad().defined() || parameter.grad().numel() == 0) continue;
    const at::Tensor grad = parameter.grad().to(torch::kFloat64);
    local = infinity ? torch::maximum(local, grad.abs().max()) : local + grad.abs().pow(norm_type).sum();
  }
  if (shard_group_size() > 1) {
    Collective& group = shard_group_ ? *shard_group_ : collective();
    group.all_reduce_(local, infinity ? ReduceOp::Max : ReduceOp::Sum);
  }
  const double total = infinity ? local.item<double>() : std::pow(local.item<double>(), 1.0 / norm_type);
  LF_CHECK(!error_if_nonfinite || std::isfinite(total), RuntimeError, "clip_gradients: the total norm of order ",
           norm_type, " of the gradients is non-finite (", total, "). Pass nonfinite_is_error(false) to clip anyway.");
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1.0) {
    for (const auto& parameter : parameters) {
      if (parameter.grad().defined()) parameter.grad().mul_(coefficient);
    }
  }
  return total;
}

uint64_t FSDPStrategy::operation_count() const {
  uint64_t count = 0;
  for (const Collective* group : {collective_.get(), shard_group_.get(), replica_group_.get()}) {
    if (group != nullptr) count += group->operation_count();
  }
  return count;
}

int64_t FSDPStrategy::resident_bytes() const {
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

// ---- checkpoints -----------------------------------------------------------------------------

StateDict FSDPStrategy::local_checkpoint(const State& state, const StateFilter& filter,
                                         std::map<std::string, std::vector<int64_t>>& global_shapes) {
  StateDict out = to_checkpoint(state, filter);  // shard tensors in optimizer entries already
  for (const auto& [key, entry] : state) {
    if (entry.kind() == StateEntry::Kind::Module) {
      ShardedModule* sharded = find(entry.module());
      if (sharded == nullptr) continue;
      StateDict module_dict = out.at(key).toGenericDict();
      for (const auto& p : sharded->parameters) {
        if (!module_dict.contains(p.name)) continue;  // filtered out
        // A shard that views its full parameter (SHARD_GRAD_OP, NO_SHARD) would save the whole storage.
        const bool owns_storage = p.shard.storage().nbytes() == static_cast<size_t>(p.shard.nbytes());
        module_dict.insert_or_assign(p.name, owns_storage ? p.shard.detach().cpu() : p.shard.detach().cpu().clone());
        global_shapes[key + "/" + p.name] = p.shape;
      }
    } else if (entry.kind() == StateEntry::Kind::Optimizer) {
      StateDict optimizer_dict = out.at(key).toGenericDict();
      if (!optimizer_dict.contains("state")) continue;
      const auto per_parameter = optimizer_dict.at("state").toGenericDict();
      int64_t index = 0;
      for (const auto& group : entry.optimizer().param_groups()) {
        for (const auto& parameter : group.params()) {
          const ShardedParameter* p = find_shard(parameter);
          auto found = per_parameter.find(index);
          if (p != nullptr && found != per_parameter.end()) {
            for (const auto& item : found->value().toGenericDict()) {
              if (item.value().isTensor() && item.value().toTensor().dim() == 1 &&
                  item.value().toTensor().numel() == p->slice.length) {
                global_shapes[key + "/state/" + std::to_string(index) + "/" + item.key().toStringRef()] = p->shape;
              }
            }
          }
          ++index;
        }
      }
    }
  }
  return out;
}

void FSDPStrategy::save_checkpoint(const fs::path& path, const State& state, const StateFilter& filter) {
  std::map<std::string, std::vector<int64_t>> global_shapes;
  StateDict local = local_checkpoint(state, filter, global_shapes);
  const int parts = shard_group_size(), part = shard_group_rank();
  std::string failure;
  if (fsdp_options_.state_dict_type == "full") {
    for (const auto& [tensor_path, shape] : global_shapes) {  // the same order on every rank
      at::Tensor slot = torch::zeros({(c10::multiply_integers(shape) + parts - 1) / parts});
      const at::Tensor mine = tensor_at_path(local, tensor_path);
      slot.narrow(0, 0, mine.numel()).copy_(mine);
      Collective& group = shard_group_ ? *shard_group_ : collective();
      const at::Tensor whole = parts > 1 ? group.all_gather(slot).reshape(-1) : slot;
      insert_at_path(local, tensor_path, whole.narrow(0, 0, c10::multiply_integers(shape)).view(shape).clone());
    }
    if (is_global_zero()) {
      try {
        save_state_dict_file(path, local);
      } catch (const std::exception& error) {
        failure = error.what();
      }
    }
    failure = broadcast_bytes(failure, 0);
    LF_CHECK(failure.empty(), RuntimeError, "fabric.save(", path.string(), ") failed on rank 0: ", failure);
    return;
  }
  // Sharded: every part writes its file into a fresh folder that replaces `path` at the end.
  const std::string staging =
      broadcast_bytes(is_global_zero() ? path.string() + ".tmp-" + std::to_string(::getpid()) : std::string(), 0);
  if (is_global_zero()) {
    std::error_code error;
    fs::remove_all(staging, error);
    fs::create_directories(staging, error);
    if (error) failure = "cannot create " + staging + ": " + error.message();
  }
  failure = broadcast_bytes(failure, 0);
  LF_CHECK(failure.empty(), RuntimeError, "fabric.save(", path.string(), "): ", failure);
  try {
    if (global_rank() < parts) {  // one replica of every part (HYBRID_SHARD: node 0's ranks)
      StateDict shard = make_state_dict();
      for (const auto& [tensor_path, shape] : global_shapes) shard.insert(tensor_path, tensor_at_path(local, tensor_path));
      save_state_dict_file(fs::path(staging) / shard_file_name(part, parts), shard);
    }
    if (is_global_zero()) {
      ShardedMetadata metadata;
      metadata.world_size = world_size();
      metadata.parts = parts;
      for (const auto& [tensor_path, shape] : global_shapes) {
        metadata.tensors[tensor_path] = {shape, tensor_at_path(local, tensor_path).scalar_type()};
        remove_at_path(local, tensor_path);
      }
      save_state_dict_file(fs::path(staging) / "common.pt", local);
      write_sharded_metadata(staging, metadata);
    }
  } catch (const std::exception& error) {
    failure = error.what();
  }
  // Every rank's outcome reaches rank 0, which then moves the folder into place.
  const at::Tensor failed = all_reduce(torch::full({1}, failure.empty() ? 0.0 : 1.0), ReduceOp::Max);
  if (is_global_zero() && failed.item<double>() == 0.0) {
    std::error_code error;
    const fs::path previous = path.string() + ".old-" + std::to_string(::getpid());
    if (fs::exists(path)) fs::rename(path, previous, error);
    if (!error) fs::rename(staging, path, error);
    if (error) failure = "cannot move " + staging + " to " + path.string() + ": " + error.message();
    fs::remove_all(previous, error);
  }
  failure = broadcast_bytes(failed.item<double>() != 0.0 && failure.empty() ? "a rank failed to write its shard" : failure, 0);
  LF_CHECK(failure.empty(), RuntimeError, "fabric.save(", path.string(), ") failed: ", failure);
}

StateDict FSDPStrategy::load_checkpoint(const fs::path& path, State* state, bool strict) {
  if (!fs::is_directory(path)) return state ? restore_local(*state, load_state_dict_file(path), strict, false)
                                           : load_state_dict_file(path);
  if (state == nullptr) return consolidate_sharded_checkpoint(path);
  const ShardedMetadata metadata = read_sharded_metadata(path);
  StateDict local = load_state_dict_file(path / "common.pt");
  std::map<int, StateDict> cache;
  for (const auto& [tensor_path, info] : metadata.tensors) {
    insert_at_path(local, tensor_path,
                   read_resharded(path, metadata, tensor_path, shard_group_size(), shard_group_rank(), cache));
  }
  return restore_local(*state, local, strict, true);
}

StateDict FSDPStrategy::restore_local(State& state, const StateDict& checkpoint, bool strict, bool tensors_are_local) {
  const int parts = shard_group_size(), part = shard_group_rank();
  torch::NoGradGuard no_grad;
  auto restore_sharded = [&](const std::string& key, StateEntry& entry, const c10::IValue& saved) {
    ShardedModule* sharded = entry.kind() == StateEntry::Kind::Module ? find(entry.module()) : nullptr;
    if (sharded != nullptr) {
      StateDict values = saved.toGenericDict();
      for (auto& p : sharded->parameters) {
        auto value = values.find(p.name);
        LF_CHECK(value != values.end() || !strict, RuntimeError, "load(strict=true): the checkpoint's '", key,
                 "' lacks parameter ", p.name, ".");
        if (value == values.end()) continue;
        const at::Tensor tensor = value->value().toTensor();
        LF_CHECK(tensors_are_local || tensor.numel() == p.numel, RuntimeError, "load: '", key, "/", p.name, "' has ",
                 tensor.numel(), " elements in the checkpoint but ", p.numel, " in the module.");
        p.shard.copy_(tensors_are_local ? tensor.reshape(-1) : slice_for_part(tensor, parts, part));
      }
      for (auto& buffer : entry.module().named_buffers(true)) {
        auto value = values.find(buffer.key());
        if (value != values.end()) buffer.value().copy_(value->value().toTensor());
      }
      for (auto& unit : sharded->units) unit.stale = true;  // the next forward gathers the restored shards
      return true;
    }
    if (entry.kind() != StateEntry::Kind::Optimizer || tensors_are_local) return false;
    // A whole checkpoint: slice each parameter's state to this rank's shard.
    StateDict values = saved.toGenericDict();
    if (values.contains("state")) {
      auto per_parameter = values.at("state").toGenericDict();
      int64_t index = 0;
      for (const auto& group : entry.optimizer().param_groups()) {
        for (const auto& parameter : group.params()) {
          const ShardedParameter* p = find_shard(parameter);
          auto slot = per_parameter.find(index++);
          if (p == nullptr || slot == per_parameter.end()) continue;
          auto param_state = slot->value().toGenericDict();
          for (const auto& field : param_state) {
            if (field.value().isTensor() && field.value().toTensor().dim() >= 1 &&
                field.value().toTensor().numel() == p->numel) {
              param_state.insert_or_assign(field.key(), slice_for_part(field.value().toTensor(), parts, part));
            }
          }
        }
      }
    }
    load_optimizer_state_dict(entry.optimizer(), values);
    return true;
  };
  return restore_from_checkpoint(state, checkpoint, strict, restore_sharded);
}

}  // namespace lightning::fabric
