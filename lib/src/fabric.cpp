#include "lightning/fabric/fabric.h"

#include "lightning/fabric/registry.h"
#include "lightning/fabric/utilities/activation_checkpoint.h"
#include "lightning/fabric/utilities/wrapper_module.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <climits>
#include <exception>
#include <filesystem>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/nn/utils/clip_grad.h>
#include <unordered_set>
#include <torch/serialize/input-archive.h>

#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/checkpoint/resume.h"
#include "lightning/fabric/connector.h"
#include "lightning/fabric/data/streaming_loader.h"
#include "lightning/fabric/internal/nonfinite_watch.h"
#include "lightning/fabric/internal/step_times.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/fsdp.h"
#include "lightning/fabric/strategies/parallel.h"
#include "lightning/fabric/utilities/empty_init.h"
#include "lightning/fabric/utilities/meta_init.h"
#include "lightning/fabric/utilities/error_file.h"
#include "lightning/fabric/utilities/rank_zero.h"

namespace lightning::fabric {

namespace {
std::shared_ptr<StepObserver> one_or_all(std::vector<std::shared_ptr<StepObserver>> observers) {
  if (observers.empty()) return nullptr;
  if (observers.size() == 1) return observers.front();
  return std::make_shared<internal::StepObservers>(std::move(observers));
}
}  // namespace

// What FabricOptimizer tells of each step: the profiler switch, and under lightning-run the step
// timer of its end-of-job summary (internal/step_times.h). Null when neither is on.
std::shared_ptr<StepObserver> Fabric::make_step_observer(const FabricOptions& options, const env::EnvLookup& env) const {
  std::vector<std::shared_ptr<StepObserver>> observers;
  const ProfileSettings profile = profile_settings_from_environment(options.profile_settings(), env);
  if (profiles_rank(profile, global_rank())) observers.push_back(std::make_shared<StepProfiler>(profile, global_rank()));
  if (auto dir = env::Reader(env).text(env::kStepTimesDir)) {
    const auto file = std::filesystem::path(*dir) / ("rank_" + std::to_string(global_rank()) + ".steps");
    observers.push_back(std::make_shared<internal::StepTimes>(file.string()));
  }
  return one_or_all(std::move(observers));
}

Fabric::Fabric(FabricOptions options) : Fabric(std::move(options), env::process_env()) {}

Fabric::Fabric(FabricOptions options, env::EnvLookup env)
    : connector_(std::make_unique<Connector>(Connector::build(options, env))),
      loggers_(options.loggers()),
      callbacks_(std::make_shared<std::vector<std::shared_ptr<Callback>>>(options.callbacks())) {
  fused_optimizer_steps_ = options.fused_optimizer_steps();
  if (options.detect_nonfinite()) nonfinite_watch_ = std::make_shared<internal::NonFiniteWatch>();
  step_observer_ = make_step_observer(options, env);
  const env::Reader reader(env);
  cli_used_ = reader.flag(env::kCliUsed);
  restart_count_ = static_cast<int>(reader.integer(env::kRestartCount, 0, INT_MAX).value_or(0));
  set_rank_zero_only_rank(global_rank());
  install_error_file_handler();
}

Fabric::~Fabric() {
  if (!connector_ || !connector_->strategy) return;
  const std::shared_ptr<Strategy>& strategy = connector_->strategy;
  if (std::uncaught_exceptions() > 0) {  // the other ranks may not be here to commit with us
    strategy->abandon_background_save();
    return;
  }
  try {
    strategy->settle_background_save(/*wait=*/true);
  } catch (const std::exception& error) {
    std::cerr << "lightning: " << error.what() << std::endl;
  }
}

const std::shared_ptr<Strategy>& Fabric::strategy() const { return connector_->strategy; }
const std::shared_ptr<Accelerator>& Fabric::accelerator() const { return connector_->accelerator; }
const std::shared_ptr<Precision>& Fabric::precision() const { return connector_->precision; }
const ResolvedConfig& Fabric::config() const { return connector_->config; }

void Fabric::launch() {
  LF_CHECK(!cli_used_, RuntimeError,
           "Fabric::launch() was called, but this program was started by lightning-run, which already created "
           "the processes (LT_CLI_USED=1). Remove the launch() call, or run the program directly without "
           "lightning-run.");
  ensure_environment_ready();
}

ScopeGuard Fabric::no_backward_sync(const torch::nn::Module& module, bool enabled) {
  const bool set_up = std::any_of(setup_modules_.begin(), setup_modules_.end(),
                                  [&](const std::weak_ptr<torch::nn::Module>& m) { return m.lock().get() == &module; });
  LF_CHECK(set_up, TypeError, "You need to set up the model first before you can call `fabric.no_backward_sync()`: "
           "`model = fabric.setup(model, ...)`. This module (", module.name(), ") was not set up by this Fabric; "
           "pass the FabricModule that fabric.setup returned.");
  return connector_->strategy->no_backward_sync(module, enabled);
}

void Fabric::ensure_environment_ready() {
  if (environment_ready_) return;
  connector_->strategy->launch_processes();  // no-op when a launcher (or a scheduler) created them
  connector_->strategy->setup_environment();
  environment_ready_ = true;
  set_rank_zero_only_rank(global_rank());
}

namespace {
c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> first_parameter(const torch::optim::Optimizer& optimizer) {
  for (const auto& group : optimizer.param_groups()) {
    if (!group.params().empty()) return c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(group.params().front().getIntrusivePtr());
  }
  return c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>());
}
}  // namespace

bool Fabric::was_set_up(const torch::optim::Optimizer& optimizer) const {
  const auto current = first_parameter(optimizer).lock();
  for (const auto& record : setup_optimizers_) {
    if (record.address != &optimizer) continue;
    const auto recorded = record.first_parameter.lock();
    if (recorded && recorded.get() == current.get()) return true;
  }
  return false;
}

void Fabric::validate_setup(const std::shared_ptr<torch::nn::Module>& module,
                            const std::vector<torch::optim::Optimizer*>& optimizers) {
  if (module) {
    const bool seen = std::any_of(setup_modules_.begin(), setup_modules_.end(),
                                  [&](const std::weak_ptr<torch::nn::Module>& m) { return m.lock() == module; });
    LF_CHECK(!seen, ValueError, "A model should be passed only once to the `setup` method. This module (",
             module->name(), ") was already set up by this Fabric; keep using the FabricModule that setup() returned.");
  }
  std::set<const torch::optim::Optimizer*> in_call;
  for (const auto* optimizer : optimizers) {
    LF_CHECK(!was_set_up(*optimizer) && in_call.insert(optimizer).second, ValueError,
             "An optimizer should be passed only once to the `setup` method. This optimizer was already set up "
             "(or appears twice in this call); keep using the FabricOptimizer that setup() returned.");
  }
}

void Fabric::prepare_module(const std::shared_ptr<torch::nn::Module>& module, const SetupOptions& options) {
  ensure_environment_ready();
  if (has_meta_tensors(*module)) connector_->strategy->materialize_meta_tensors(*module);
  connector_->precision->convert_module(*module);
  if (options.move_to_device) connector_->strategy->module_to_device(*module);
  if (apply_activation_checkpointing(
          *module, options.activation_checkpointing.value_or(connector_->strategy->activation_checkpointing())) > 0) {
    for (const auto& item : module->named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
      auto* wrapper = dynamic_cast<WrapperModule*>(item.value().get());
      const std::shared_ptr<torch::nn::Module>& subject = wrapper != nullptr ? wrapper->wrapped() : item.value();
      if (is_checkpointed(*subject) && !subject->parameters().empty()) unverified_checkpointed_.emplace_back(item.key(), subject);
    }
  }
  connector_->strategy->setup_module(module);
  setup_modules_.erase(std::remove_if(setup_modules_.begin(), setup_modules_.end(),
                                      [](const std::weak_ptr<torch::nn::Module>& m) { return m.expired(); }),
                       setup_modules_.end());
  setup_modules_.push_back(module);
}

void Fabric::prepare_optimizer(torch::optim::Optimizer& optimizer) {
  connector_->strategy->setup_optimizer(optimizer);
  setup_optimizers_.erase(std::remove_if(setup_optimizers_.begin(), setup_optimizers_.end(),
                                         [](const OptimizerRecord& r) { return r.first_parameter.expired(); }),
                          setup_optimizers_.end());
  setup_optimizers_.push_back({&optimizer, first_parameter(optimizer)});
}

void Fabric::refuse_wrapped_module() const {
  throw ValueError(
      "A model should be passed only once to the `setup` method. This object is already a FabricModule "
      "(returned by an earlier setup); pass the original module to a single setup call.");
}

void Fabric::refuse_wrapped_optimizer() const {
  throw ValueError(
      "An optimizer should be passed only once to the `setup` method. This object is already a "
      "FabricOptimizer (returned by an earlier setup); pass the original optimizer to a single setup call.");
}

void Fabric::refuse_scheduler_order() const {
  throw ValueError(
      "Fabric::setup(module, optimizers..., scheduler): the scheduler must come after every optimizer. "
      "Move it to the end of the argument list.");
}

void Fabric::refuse_empty_setup_optimizers() const {
  throw ValueError("`setup_optimizers` requires at least one optimizer as input. Pass the optimizer(s) "
                   "built over the set-up module's parameters.");
}

void Fabric::refuse_prebuilt_loader() const {
  throw ValueError(
      "setup_dataloaders(loader): this job runs " + std::to_string(world_size()) +
      " processes, and a ready-made LibTorch loader cannot have its sampler replaced, so every rank would read "
      "the whole dataset. Pass the dataset and DataLoaderOptions instead (Fabric builds a distributed "
      "sampler), or the dataset, your sampler and DataLoaderOptions (Fabric distributes your sampler's order), or set DataLoaderSettings::use_distributed_sampler=false if your sampler already splits the "
      "data per rank.");
}

void Fabric::refuse_unsized_dataset() const {
  throw ValueError("setup_dataloaders(dataset, options): dataset.size() is empty, so its indices cannot be split over "
                   "the ranks. A dataset without a size is a stream: derive it from "
                   "torch::data::datasets::StatefulDataset (get_batch returns std::nullopt at its end), and each rank "
                   "then reads every " + std::to_string(strategy()->sampler_share().replicas) + "-th item.");
}

void Fabric::refuse_shuffled_stream(bool shuffle) const {
  LF_CHECK(!shuffle, ValueError, "setup_dataloaders(stream, options, DataLoaderSettings{shuffle=true}): a stream (a "
           "StatefulDataset) has no indices to shuffle. Shuffle inside the stream, seeded by the epoch it gets through "
           "a set_epoch(int64_t) method (Fabric calls it each epoch), and pass shuffle=false.");
}

void Fabric::refuse_if_joint_setup_required(const char* call) const {
  LF_CHECK(!connector_->strategy->requires_joint_setup(), RuntimeError, "The strategy '",
           connector_->strategy->name(), "' requires the model and optimizer(s) to be set up jointly through ",
           "fabric.setup(model, optimizer, ...); `", call, "` is not allowed with it.");
}

namespace {
// Whether loss's autograd graph reaches one of `parameters` (depth first, so a set-up model's
// last layer is usually found within a few nodes).
bool graph_reaches(const at::Tensor& loss, const std::unordered_set<const c10::TensorImpl*>& parameters) {
  std::vector<torch::autograd::Node*> pending{loss.grad_fn().get()};
  std::unordered_set<const torch::autograd::Node*> seen;
  while (!pending.empty()) {
    torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (auto* leaf = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      if (parameters.count(leaf->variable.unsafeGetTensorImpl()) != 0) return true;
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function && seen.insert(edge.function.get()).second) pending.push_back(edge.function.get());
    }
  }
  return false;
}
}  // namespace

void Fabric::refuse_loss_from_unset_model(const at::Tensor& loss) const {
  if (world_size() < 2 || !loss.defined() || !loss.grad_fn()) return;
  if (!connector_->strategy->averages_gradients()) return;
  std::unordered_set<const c10::TensorImpl*> parameters;
  for (const auto& weak : setup_modules_) {
    if (auto module = weak.lock()) {
      for (const auto& parameter : module->parameters()) parameters.insert(parameter.unsafeGetTensorImpl());
    }
  }
  LF_CHECK(graph_reaches(loss, parameters), RuntimeError, "fabric.backward: the loss does not depend on any model "
           "set up with fabric.setup, so under the '", connector_->strategy->name(), "' strategy its gradients would "
           "not be averaged across the ", world_size(), " ranks. Set the model up first (auto [model, optimizer] = "
           "fabric.setup(net, optimizer)) and compute the loss with the returned model.");
}

void Fabric::after_setup(const std::shared_ptr<torch::nn::Module>& module, bool call_hook) {
  if (auto callback = std::dynamic_pointer_cast<Callback>(module)) {
    const bool known = std::any_of(callbacks_->begin(), callbacks_->end(),
                                   [&](const std::shared_ptr<Callback>& c) { return c.get() == callback.get(); });
    if (!known) callbacks_->push_back(callback);
  }
  if (call_hook) call("on_after_setup", HookArgs{{"fabric", this}, {"module", module}});
}

void Fabric::backward(at::Tensor loss, const BackwardOptions& options) {
  RECORD_USER_SCOPE("lf::backward");  // a profiler range (utilities/profiler.h); free when none runs
  refuse_loss_from_unset_model(loss);
  connector_->strategy->settle_background_save(/*wait=*/false);
  if (nonfinite_watch_) nonfinite_watch_->before_backward();
  {
    detail::BackwardScope scope;
    connector_->strategy->backward(loss, nullptr, options);
  }
  if (!unverified_checkpointed_.empty()) refuse_checkpointing_that_did_nothing();
  if (nonfinite_watch_) {
    internal::NamedGradients gradients;
    for_each_trained_tensor([&](const std::string& name, const at::Tensor& tensor) { gradients.emplace_back(name, tensor.grad()); });
    try {
      nonfinite_watch_->after_backward(*this, loss, gradients, /*check_gradients=*/connector_->precision->loss_scaler() == nullptr);
    } catch (const NonFiniteError& error) {
      if (!rollback_state_) throw;
      if (!rollback_checkpoint()) throw NonFiniteError(std::string(error.what()) + "\n" + no_rollback_checkpoint(), error.step(), error.ranks());
      roll_back(error.what());
    }
  }
}

void Fabric::for_each_trained_tensor(const std::function<void(const std::string&, const at::Tensor&)>& f) const {
  for (const auto& each : setup_modules_) {
    auto module = each.lock();
    if (!module) continue;
    for (const auto& [name, tensor] : connector_->strategy->trained_tensors(*module)) f(name, tensor);
  }
}

namespace {
// The live objects of state (recursively): what a rollback restores. A streaming loader is left
// out: a rollback leaves loader positions where they are, so the data moves on past the bad batch
// (and its pass goes on reading).
State live_objects(const State& state, const std::vector<std::string>& resume_names) {
  State live;
  for (const auto& [name, entry] : state) {
    if (std::find(resume_names.begin(), resume_names.end(), name) != resume_names.end()) continue;
    if (entry.kind() == StateEntry::Kind::Object && dynamic_cast<const StreamingDataLoader*>(&entry.object()) == nullptr) {
      live.emplace(name, entry);
    }
    if (entry.kind() == StateEntry::Kind::Nested) {
      State nested = live_objects(entry.nested(), {});
      if (!nested.empty()) live.emplace(name, StateEntry(std::move(nested)));
    }
  }
  return live;
}

// The State's optimizers' gradients (the set-up modules' are dropped through for_each_trained_tensor).
void drop_gradients(const State& state) {
  for (const auto& [name, entry] : state) {
    if (entry.kind() == StateEntry::Kind::Nested) drop_gradients(entry.nested());
    if (auto* optimizer = entry.optimizer()) {
      for (auto& group : optimizer->param_groups()) {
        for (auto& parameter : group.params()) parameter.mutable_grad().reset();
      }
    }
  }
}
}  // namespace

std::string Fabric::no_rollback_checkpoint() {
  return "Rollback is on (fabric.roll_back_on_bad_steps), but there is no checkpoint to roll back to: this Fabric has "
         "not saved or loaded one that holds every entry of the rollback state (without a filter) and is still on disk. "
         "Save one before the first step (fabric.save right after setup), then at the interval you can afford to lose.";
}

void Fabric::note_checkpoint(const std::filesystem::path& path, const State& state) {
  std::set<std::string> names;
  for (const auto& [name, entry] : state) names.insert(name);
  checkpoints_.erase(std::remove_if(checkpoints_.begin(), checkpoints_.end(), [&](const auto& c) { return c.first == path; }),
                     checkpoints_.end());
  checkpoints_.emplace_back(path, std::move(names));
  if (checkpoints_.size() > 16) checkpoints_.erase(checkpoints_.begin());
}

std::optional<std::filesystem::path> Fabric::rollback_checkpoint() const {
  for (auto it = checkpoints_.rbegin(); it != checkpoints_.rend(); ++it) {
    bool covers = true;
    if (rollback_state_) {
      for (const auto& [name, entry] : *rollback_state_) covers = covers && it->second.count(name) > 0;
    }
    std::error_code ignored;
    if (covers && std::filesystem::exists(it->first, ignored)) return it->first;
  }
  return std::nullopt;
}

void Fabric::roll_back_on_bad_steps(const State& state) {
  auto live = std::make_shared<State>(live_objects(state, resume::entry_names(state, *this, "fabric.roll_back_on_bad_steps")));
  LF_CHECK(!live->empty(), ValueError, "fabric.roll_back_on_bad_steps: the State holds no live object (a module, optimizer, "
           "LR scheduler or Stateful of yours) to restore; pass the State you save, e.g. {{\"model\", model}, "
           "{\"optimizer\", optimizer}}.");
  rollback_state_ = std::move(live);
}

void Fabric::stop_rolling_back() { rollback_state_.reset(); }

std::filesystem::path Fabric::roll_back(const std::string& finding) {
  LF_CHECK(rollback_state_ != nullptr, RuntimeError, "fabric.roll_back(\"", finding, "\"): rollback is off. Turn it on with "
           "fabric.roll_back_on_bad_steps(state), passing the State you save.");
  connector_->strategy->settle_background_save(/*wait=*/true);  // a background save counts once complete
  const std::optional<std::filesystem::path> found = rollback_checkpoint();
  LF_CHECK(found.has_value(), RuntimeError, finding, "\n", no_rollback_checkpoint());
  const std::filesystem::path path = *found;
  std::string failure;
  try {
    connector_->strategy->load_checkpoint(path, rollback_state_.get(), /*strict=*/true);
  } catch (const std::exception& error) {
    failure = error.what();
  }
  // One outcome for every rank: a rank that could not read the file must not leave the others
  // training on alone.
  const bool loaded = all_reduce(failure.empty() ? 1.0 : 0.0, ReduceOp::Min) > 0.5;
  LF_CHECK(loaded, RuntimeError, finding, "\nRolling back to ", path.string(), " failed",
           failure.empty() ? std::string(" on another rank") : ": " + failure);
  drop_gradients(*rollback_state_);
  for_each_trained_tensor([](const std::string&, const at::Tensor& tensor) { tensor.mutable_grad().reset(); });
  rank_zero_warn(finding + "\nRolled back to " + path.string() + " (the live objects of the State given to "
                 "fabric.roll_back_on_bad_steps) and dropped the gradients; training goes on with the next batch.");
  return path;
}

std::vector<at::Tensor> Fabric::grad(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                     const GradOptions& options) {
  RECORD_USER_SCOPE("lf::grad");
  LF_CHECK(!outputs.empty() && !inputs.empty(), ValueError, "fabric.grad(outputs, inputs): got ", outputs.size(),
           " outputs and ", inputs.size(), " inputs; pass at least one of each, as torch.autograd.grad needs.");
  LF_CHECK(options.grad_outputs.empty() || options.grad_outputs.size() == outputs.size(), ValueError,
           "fabric.grad: GradOptions::grad_outputs has ", options.grad_outputs.size(), " tensors for ", outputs.size(),
           " outputs; give one per output (or none, for scalar outputs).");
  connector_->strategy->settle_background_save(/*wait=*/false);
  connector_->strategy->before_grad(options.create_graph);
  // Under a loss scaler, as PyTorch's recipe for penalties with GradScaler: scaled outputs keep
  // small float16 gradients from underflowing; dividing inside the graph gives true-scale values.
  const std::shared_ptr<LossScaler> scaler = connector_->precision->loss_scaler();
  const double scale = scaler ? scaler->get_scale() : 1.0;
  std::vector<at::Tensor> scaled = outputs;
  if (scale != 1.0) {
    for (auto& output : scaled) output = output * scale;
  }
  std::vector<at::Tensor> grads;
  {
    detail::BackwardScope scope;
    grads = torch::autograd::grad(scaled, inputs, options.grad_outputs, options.retain_graph, options.create_graph,
                                  options.allow_unused);
  }
  if (scale != 1.0) {
    for (auto& grad : grads) {
      if (grad.defined()) grad = grad / scale;
    }
  }
  return grads;
}

// A module marked for checkpointing that ran (its parameters have gradients) without a single
// checkpointed call: the parent calls it directly, and the policy recomputes nothing. Modules seen
// checkpointed, or gone, leave the list; one that has not run yet stays until it does.
void Fabric::refuse_checkpointing_that_did_nothing() {
  std::vector<std::string> missed;
  std::vector<std::pair<std::string, std::weak_ptr<torch::nn::Module>>> waiting;
  for (auto& [name, weak] : unverified_checkpointed_) {
    const auto module = weak.lock();
    if (module == nullptr || detail::checkpointed_calls(*module) > 0) continue;
    const auto parameters = module->parameters();
    const bool ran = std::any_of(parameters.begin(), parameters.end(), [](const at::Tensor& p) { return p.grad().defined(); });
    if (ran) {
      missed.push_back("'" + name + "'");
    } else {
      waiting.emplace_back(std::move(name), std::move(weak));
    }
  }
  unverified_checkpointed_ = std::move(waiting);
  LF_CHECK(missed.empty(), ValueError, "Activation checkpointing: the modules ", join_names(missed), " match the "
           "checkpointing policy and ran in this backward, but never through lf::call, so nothing was recomputed "
           "(the policy saved no memory). LibTorch modules have no forward hooks: call them in the parent's forward "
           "as lf::call(block, x), hold them in a torch::nn::Sequential, or drop them from the policy "
           "(docs/toolkit.md, \"Activation checkpointing\").");
}

std::shared_ptr<torch::nn::Module> Fabric::to_device(const std::shared_ptr<torch::nn::Module>& module) const {
  module->to(device());
  return module;
}

void Fabric::barrier(const std::string& name) {
  ensure_environment_ready();
  connector_->strategy->settle_background_save(/*wait=*/false);
  connector_->strategy->barrier(name);
}

at::Tensor Fabric::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  ensure_environment_ready();
  connector_->strategy->settle_background_save(/*wait=*/false);
  return connector_->strategy->all_reduce(tensor, op);
}

double Fabric::all_reduce(double value, ReduceOp op) {
  return all_reduce(at::full({1}, value, at::kDouble), op).item<double>();
}

std::string Fabric::broadcast(const std::string& value, int src) {
  ensure_environment_ready();
  connector_->strategy->settle_background_save(/*wait=*/false);
  return connector_->strategy->broadcast_bytes(value, src);
}

ScopeGuard Fabric::rank_zero_first(bool local) {
  ensure_environment_ready();
  // A background save completes here, on every rank together, not in the closing guard (a
  // destructor, which must not throw its failure).
  connector_->strategy->settle_background_save(/*wait=*/false);
  const bool first = (local ? local_rank() : global_rank()) == 0;
  // Only ranks that must wait block at entry; rank 0 releases them when its block ends.
  if (!first) connector_->strategy->barrier();
  // A block that throws skips rank 0's barrier: the error goes on instead of a barrier (which
  // could itself fail during unwinding and terminate the program).
  return ScopeGuard([this, first, unwinding = std::uncaught_exceptions()] {
    if (first && std::uncaught_exceptions() == unwinding) connector_->strategy->barrier();
  });
}

namespace {
// all_gather whose backward sends each rank the sum, over the group, of the gradient of its slice
// (a reduce-scatter), as torch.distributed.nn's all_gather. The graph keeps the group alive
// (a user group may be dropped before the backward; the world's lives with the strategy).
struct HeldGroup : torch::CustomClassHolder {
  Collective* collective = nullptr;
  std::shared_ptr<ProcessGroup> owner;  // null for the world's
};

struct GatherWithGradients : torch::autograd::Function<GatherWithGradients> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& tensor, Collective* group,
                            std::shared_ptr<ProcessGroup> owner) {
    auto held = c10::make_intrusive<HeldGroup>();
    held->collective = group;
    held->owner = std::move(owner);
    ctx->saved_data["group"] = c10::IValue::make_capsule(held);
    ctx->saved_data["shape"] = tensor.sizes().vec();
    return group->all_gather(tensor);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto held = c10::static_intrusive_pointer_cast<HeldGroup>(ctx->saved_data["group"].toCapsule());
    Collective* group = held->collective;
    const at::Tensor rows = grads[0].contiguous().reshape({group->world_size(), -1});
    return {group->reduce_scatter(rows, ReduceOp::Sum).reshape(ctx->saved_data["shape"].toIntVector()), at::Tensor(),
            at::Tensor()};
  }
};
}  // namespace

std::shared_ptr<ProcessGroup> Fabric::new_group(std::vector<int> ranks) {
  ensure_environment_ready();
  const int world = world_size();
  LF_CHECK(!ranks.empty(), ValueError, "fabric.new_group(ranks): no ranks given; name global ranks in 0..", world - 1, ".");
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    LF_CHECK(ranks[i] >= 0 && ranks[i] < world, ValueError, "fabric.new_group(ranks): rank ", ranks[i],
             " is not a rank of this job; valid global ranks are 0..", world - 1, ".");
    LF_CHECK(i == 0 || ranks[i] != ranks[i - 1], ValueError, "fabric.new_group(ranks): rank ", ranks[i],
             " is named twice; name each member once.");
  }
  const auto at = std::find(ranks.begin(), ranks.end(), global_rank());
  const int rank = at == ranks.end() ? -1 : static_cast<int>(at - ranks.begin());
  if (world == 1) return std::make_shared<ProcessGroup>(std::move(ranks), rank, nullptr);
  auto* parallel = dynamic_cast<ParallelStrategy*>(connector_->strategy.get());
  LF_CHECK(parallel != nullptr, ValueError, "fabric.new_group: strategy \"", connector_->strategy->name(),
           "\" runs ", world, " ranks without a process group of its own; use ddp, fsdp or model_parallel.");
  // Every rank takes the next name, members or not, so later groups agree on theirs.
  const std::string name = parallel->collective().next_group_name("fabric-group");
  std::shared_ptr<Collective> collective;
  if (rank >= 0 && ranks.size() > 1) collective = std::make_shared<Collective>(parallel->collective(), name, ranks);
  return std::make_shared<ProcessGroup>(std::move(ranks), rank, std::move(collective));
}

ProcessGroup Fabric::world_group() {
  ensure_environment_ready();
  std::vector<int> ranks(static_cast<size_t>(world_size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  std::shared_ptr<Collective> collective;
  if (world_size() > 1) {
    auto* parallel = dynamic_cast<ParallelStrategy*>(connector_->strategy.get());
    LF_CHECK(parallel != nullptr, ValueError, "fabric: strategy \"", connector_->strategy->name(), "\" runs ", world_size(),
             " ranks without a process group of its own; use ddp, fsdp or model_parallel for collectives.");
    collective = std::shared_ptr<Collective>(std::shared_ptr<Collective>(), &parallel->collective());  // not owned
  }
  return ProcessGroup(std::move(ranks), global_rank(), std::move(collective));
}

Collective* Fabric::participants(const ProcessGroup& group, const char* call, bool every_member) {
  ensure_environment_ready();
  // A background save settles with an all-reduce over every rank: only where every rank is here.
  if (every_member && group.size() == world_size()) connector_->strategy->settle_background_save(/*wait=*/false);
  return group.communicator(call, global_rank());
}

at::Tensor Fabric::all_gather(const at::Tensor& tensor, const AllGatherOptions& options) {
  LF_CHECK(!options.sync_grads || tensor.is_floating_point() || tensor.is_complex(), ValueError,
           "fabric.all_gather(tensor, AllGatherOptions().with_gradients()) on rank ", global_rank(), ": the tensor is ",
           c10::toString(tensor.scalar_type()), ", which has no gradients; gather it without with_gradients(), or gather "
           "a floating-point tensor.");
  if (world_size() == 1) return connector_->strategy->all_gather(tensor);  // one process: no new dimension, as Python
  Collective* group = participants(options.group ? *options.group : world_group(), "fabric.all_gather");
  if (group == nullptr) return tensor.unsqueeze(0);  // a group of this process alone
  group->check_same_shapes("fabric.all_gather", tensor);
  return options.sync_grads ? GatherWithGradients::apply(tensor, group, options.group) : group->all_gather(tensor);
}

std::vector<at::Tensor> Fabric::all_gather(const std::vector<at::Tensor>& tensors, const AllGatherOptions& options) {
  std::vector<at::Tensor> gathered;
  gathered.reserve(tensors.size());
  for (const auto& tensor : tensors) gathered.push_back(all_gather(tensor, options));
  return gathered;
}

at::Tensor Fabric::all_reduce(const at::Tensor& tensor, ReduceOp op, const ProcessGroup& group) {
  Collective* collective = participants(group, "fabric.all_reduce");
  at::Tensor result = tensor.contiguous();  // in place when it is, as the world's all_reduce (and Python's)
  if (collective != nullptr) collective->all_reduce_(result, op);
  return result;
}

at::Tensor Fabric::broadcast(const at::Tensor& tensor, int src) {
  ensure_environment_ready();
  connector_->strategy->settle_background_save(/*wait=*/false);
  return connector_->strategy->broadcast(tensor, src);
}

at::Tensor Fabric::broadcast(const at::Tensor& tensor, int src, const ProcessGroup& group) {
  Collective* collective = participants(group, "fabric.broadcast");
  const int root = group.group_rank_of(src, "fabric.broadcast");
  at::Tensor result = tensor.clone().contiguous();
  if (collective != nullptr) collective->broadcast_(result, root);
  return result;
}

// Python's torch.distributed collectives: each world version is its group version over world_group().
void Fabric::send(const at::Tensor& tensor, int dst) { send(tensor, dst, world_group()); }
void Fabric::send(const at::Tensor& tensor, int dst, const ProcessGroup& group) {
  Collective* collective = participants(group, "fabric.send", /*every_member=*/false);
  const int peer = group.group_rank_of(dst, "fabric.send");
  LF_CHECK(collective != nullptr && peer != group.rank(), ValueError, "fabric.send: rank ", dst, " is this process; "
           "send to another rank (it calls fabric.recv).");
  collective->send(tensor, peer);
}

at::Tensor Fabric::recv(at::Tensor tensor, int src) { return recv(std::move(tensor), src, world_group()); }
at::Tensor Fabric::recv(at::Tensor tensor, int src, const ProcessGroup& group) {
  Collective* collective = participants(group, "fabric.recv", /*every_member=*/false);
  const int peer = group.group_rank_of(src, "fabric.recv");
  LF_CHECK(collective != nullptr && peer != group.rank(), ValueError, "fabric.recv: rank ", src, " is this process; "
           "receive from another rank (it calls fabric.send).");
  collective->recv_(tensor, peer);
  return tensor;
}

at::Tensor Fabric::reduce(const at::Tensor& tensor, int dst, ReduceOp op) { return reduce(tensor, dst, op, world_group()); }
at::Tensor Fabric::reduce(const at::Tensor& tensor, int dst, ReduceOp op, const ProcessGroup& group) {
  Collective* collective = participants(group, "fabric.reduce");
  const int root = group.group_rank_of(dst, "fabric.reduce");
  return collective != nullptr ? collective->reduce(tensor, root, op) : tensor.clone();
}

at::Tensor Fabric::gather(const at::Tensor& tensor, int dst) { return gather(tensor, dst, world_group()); }
at::Tensor Fabric::gather(const at::Tensor& tensor, int dst, const ProcessGroup& group) {
  Collective* collective = participants(group, "fabric.gather");
  const int root = group.group_rank_of(dst, "fabric.gather");
  if (collective == nullptr) return tensor.unsqueeze(0).clone();
  collective->check_same_shapes("fabric.gather", tensor);
  return collective->gather(tensor, root);
}

at::Tensor Fabric::scatter(at::Tensor output, const at::Tensor& rows, int src) {
  return scatter(std::move(output), rows, src, world_group());
}
at::Tensor Fabric::scatter(at::Tensor output, const at::Tensor& rows, int src, const ProcessGroup& group) {
  Collective* collective = participants(group, "fabric.scatter");
  const int root = group.group_rank_of(src, "fabric.scatter");
  if (collective == nullptr) {
    LF_CHECK(rows.defined() && rows.dim() >= 1 && rows.size(0) == 1 && rows[0].sizes() == output.sizes(), ValueError,
             "fabric.scatter: with one participant, rows must be [1, ", output.sizes(), "], got ",
             rows.defined() ? c10::str(rows.sizes()) : std::string("none"), ".");
    return output.copy_(rows[0]);
  }
  // Every participant checks the source's rows (one small broadcast of their dtype and shape), so
  // a mistake is an error on each of them, not a wait on all but the source.
  constexpr int64_t kSlots = 18;  // defined, dtype, dim, up to 15 sizes
  at::Tensor described = at::full({kSlots}, -1, at::kLong);
  if (global_rank() == src && rows.defined() && rows.dim() <= kSlots - 3) {
    described[0] = 1;
    described[1] = static_cast<int64_t>(rows.scalar_type());
    described[2] = rows.dim();
    for (int64_t d = 0; d < rows.dim(); ++d) described[3 + d] = rows.size(d);
  }
  collective->broadcast_(described, root);
  std::vector<int64_t> expected{group.size()};
  expected.insert(expected.end(), output.sizes().begin(), output.sizes().end());
  const auto* fields = described.data_ptr<int64_t>();
  std::vector<int64_t> got(fields + 3, fields + 3 + std::max<int64_t>(0, fields[2]));
  LF_CHECK(fields[0] == 1 && fields[1] == static_cast<int64_t>(output.scalar_type()) && got == expected, ValueError,
           "fabric.scatter: rank ", src, "'s rows are ",
           fields[0] == 1 ? c10::str(c10::toString(static_cast<c10::ScalarType>(fields[1])), at::IntArrayRef(got))
                          : std::string("missing"),
           "; every participant expects ", c10::toString(output.scalar_type()), at::IntArrayRef(expected),
           ", one row shaped like the output per participant, in group-rank order.");
  return collective->scatter_(output, rows, root);
}

at::Tensor Fabric::reduce_scatter(const at::Tensor& rows, ReduceOp op) { return reduce_scatter(rows, op, world_group()); }
at::Tensor Fabric::reduce_scatter(const at::Tensor& rows, ReduceOp op, const ProcessGroup& group) {
  Collective* collective = participants(group, "fabric.reduce_scatter");
  LF_CHECK(rows.dim() >= 1 && rows.size(0) == group.size(), ValueError, "fabric.reduce_scatter: rows must have one "
           "row per participant (", group.size(), ") in their first dimension, got shape ", rows.sizes(), ".");
  return collective != nullptr ? collective->reduce_scatter(rows, op) : rows[0].clone();
}

at::Tensor Fabric::all_to_all(const at::Tensor& tensor) { return all_to_all(tensor, world_group()); }
at::Tensor Fabric::all_to_all(const at::Tensor& tensor, const ProcessGroup& group) {
  Collective* collective = participants(group, "fabric.all_to_all");
  LF_CHECK(tensor.dim() >= 1 && tensor.size(0) % group.size() == 0, ValueError, "fabric.all_to_all: the first "
           "dimension (shape ", tensor.sizes(), ") must split into ", group.size(), " equal blocks, one per participant.");
  if (collective == nullptr) return tensor.clone();
  return collective->all_to_all(tensor).view(tensor.sizes());
}

uint64_t Fabric::seed_everything(std::optional<uint64_t> seed, bool workers) {
  return lightning::fabric::seed_everything(seed, workers);
}

std::optional<at::Tensor> Fabric::clip_optimizer_gradients(torch::optim::Optimizer& optimizer,
                                                           const GradientClipping& clipping) {
  LF_CHECK(!(clipping.clip_val && clipping.max_norm), ValueError,
           "clip_gradients: give either clip_val or max_norm, not both: they are two different clipping methods.");
  LF_CHECK(clipping.clip_val || clipping.max_norm, ValueError,
           "clip_gradients: give clip_val (clip each gradient element) or max_norm (clip the total norm).");
  connector_->precision->unscale_gradients(optimizer);
  std::vector<at::Tensor> parameters;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) {
      if (parameter.grad().defined()) parameters.push_back(parameter);
    }
  }
  if (clipping.clip_val) {
    torch::nn::utils::clip_grad_value_(parameters, *clipping.clip_val);
    return std::nullopt;
  }
  const double norm = connector_->strategy->clip_gradients_by_norm(parameters, *clipping.max_norm, clipping.norm_type,
                                                                 clipping.error_if_nonfinite);
  return at::scalar_tensor(norm, at::kDouble);
}

void Fabric::call(const std::string& name, const HookArgs& args) {
  if (args.contains("fabric")) {
    for (const auto& callback : *callbacks_) invoke_hook(*callback, name, args);
    return;
  }
  HookArgs with_fabric = args;  // hooks that need the Fabric (Python passes fabric=) find it
  with_fabric.set("fabric", this);
  for (const auto& callback : *callbacks_) invoke_hook(*callback, name, with_fabric);
}

void Fabric::log(const std::string& name, double value, std::optional<int64_t> step) {
  log_dict({{name, value}}, step);
}

void Fabric::log(const std::string& name, const at::Tensor& value, std::optional<int64_t> step) {
  LF_CHECK(value.numel() == 1, ValueError, "fabric.log('", name, "', tensor): the tensor has ", value.numel(),
           " elements; log a scalar (e.g. loss.mean()).");
  log_dict({{name, value.item<double>()}}, step);
}

void Fabric::log_dict(const std::map<std::string, double>& metrics, std::optional<int64_t> step) {
  if (!is_global_zero()) return;
  for (const auto& logger : loggers_) logger->log_metrics(metrics, step);
}

std::shared_ptr<LoaderProgress> Fabric::track_loader(std::shared_ptr<PassControl> control, bool stream,
                                                    int64_t units_per_batch, int64_t replicas, int64_t rank) {
  auto progress = std::make_shared<LoaderProgress>();
  progress->control = std::move(control);
  progress->stream = stream;
  progress->units_per_batch = units_per_batch;
  progress->replicas = replicas;
  progress->rank = rank;
  setup_loaders_.erase(std::remove_if(setup_loaders_.begin(), setup_loaders_.end(),
                                      [](const std::weak_ptr<LoaderProgress>& each) { return each.expired(); }),
                       setup_loaders_.end());
  setup_loaders_.push_back(progress);
  return progress;
}

std::vector<std::shared_ptr<LoaderProgress>> Fabric::live_loaders() const {
  std::vector<std::shared_ptr<LoaderProgress>> live;
  for (const auto& each : setup_loaders_) {
    if (auto progress = each.lock()) live.push_back(std::move(progress));
  }
  return live;
}

void Fabric::setup_streaming_loader(StreamingDataLoader& loader) {
  const auto share = strategy()->sampler_share();
  loader.place(share.replicas, share.rank, device(), "fabric.setup_dataloaders");
  streaming_loaders_.erase(std::remove_if(streaming_loaders_.begin(), streaming_loaders_.end(),
                                          [](const std::weak_ptr<StreamingDataLoader*>& each) { return each.expired(); }),
                           streaming_loaders_.end());
  streaming_loaders_.push_back(loader.handle_);
}

std::vector<StreamingDataLoader*> Fabric::live_streaming_loaders() const {
  std::vector<StreamingDataLoader*> live;
  for (const auto& each : streaming_loaders_) {
    if (auto handle = each.lock()) live.push_back(*handle);
  }
  return live;
}

std::optional<State> Fabric::with_resume_values(const State& state, const char* call) {
  const std::vector<std::string> names = resume::entry_names(state, *this, call);
  if (names.empty()) return std::nullopt;
  const c10::IValue saved = resume::gather(*this, live_loaders(), live_streaming_loaders());
  State resolved = state;
  for (const auto& name : names) resolved.insert_or_assign(name, StateEntry(saved));
  return resolved;
}

void Fabric::save(const std::filesystem::path& path, const State& state, const StateFilter& filter) {
  ensure_environment_ready();  // collective: a job that saves before any setup still needs its group
  const std::optional<State> resolved = with_resume_values(state, "fabric.save");
  connector_->strategy->save_checkpoint(path, resolved ? *resolved : state, filter, /*in_background=*/false);
  if (filter.empty()) note_checkpoint(path, state);
}

void Fabric::save_in_background(const std::filesystem::path& path, const State& state, const StateFilter& filter) {
  ensure_environment_ready();
  const std::optional<State> resolved = with_resume_values(state, "fabric.save_in_background");
  connector_->strategy->save_checkpoint(path, resolved ? *resolved : state, filter, /*in_background=*/true);
  // A rollback waits for it to complete; a failed one leaves the file as it was (or none).
  if (filter.empty()) note_checkpoint(path, state);
}

void Fabric::wait_for_background_save() { connector_->strategy->settle_background_save(/*wait=*/true); }

StateDict Fabric::load(const std::filesystem::path& path, State& state, bool strict) {
  ensure_environment_ready();
  connector_->strategy->settle_background_save(/*wait=*/true);
  const std::vector<std::string> names = resume::entry_names(state, *this, "fabric.load");
  if (names.empty()) {
    StateDict remainder = connector_->strategy->load_checkpoint(path, &state, strict);
    if (strict) note_checkpoint(path, state);
    return remainder;
  }
  // The resume entries are read from what the file holds beyond the rest of state.
  State others = state;
  for (const auto& name : names) others.erase(name);
  StateDict remainder = connector_->strategy->load_checkpoint(path, &others, strict);
  for (auto& [name, entry] : others) {
    if (entry.kind() == StateEntry::Kind::Value) state.at(name).set_value(entry.value());
  }
  for (const auto& name : names) {
    auto found = remainder.find(name);
    if (found == remainder.end()) {
      const std::string message = "fabric.load(" + path.string() + "): the checkpoint has no '" + name +
                                  "' entry (fabric.resume_state(): every rank's generators and loader positions); it "
                                  "was saved without one, so this resume cannot be exact.";
      LF_CHECK(!strict, RuntimeError, message, " Load it with strict=false to resume inexactly (a warning), or leave "
               "fabric.resume_state() out of the State for this load.");
      rank_zero_warn(message + " Resuming inexactly: the generators and loaders go on from where they are.");
      continue;
    }
    resume::restore(*this, found->value(), live_loaders(), live_streaming_loaders(), path, name);
    (void)remainder.erase(name);  // StateDict::erase returns whether it was there; it is (found above)
  }
  if (strict) note_checkpoint(path, state);
  return remainder;
}

StateDict Fabric::load(const std::filesystem::path& path) {
  ensure_environment_ready();
  connector_->strategy->settle_background_save(/*wait=*/true);
  return connector_->strategy->load_checkpoint(path, nullptr, true);
}

void Fabric::load_raw(const std::filesystem::path& path, const StateEntry& target, bool strict) {
  std::optional<StateDict> state;
  try {
    state = load_state_dict_file(path);
  } catch (const RuntimeError&) {
    // Not a pickled dict: a module may come as a LibTorch archive written by torch::save(module, path).
    if (target.module() == nullptr || !std::filesystem::is_regular_file(path)) throw;
    torch::serialize::InputArchive archive;
    try {
      archive.load_from(path.string());
    } catch (const c10::Error&) {
      throw RuntimeError("load_raw: " + path.string() + " is neither a state-dict checkpoint nor a LibTorch "
                         "archive of a module (torch::save). Is it truncated or another format?");
    }
    target.module()->load(archive);
    return;
  }
  load_state_dict_into(target, *state, strict);
}

ScopeGuard Fabric::autocast() const { return connector_->precision->forward_context(); }

ScopeGuard Fabric::init_tensor() const { return connector_->precision->tensor_init_context(); }

ScopeGuard Fabric::init_module(bool empty_init) const {
  if (empty_init && connector_->strategy->builds_on_meta_device()) {
    return connector_->precision->module_init_context().then(meta_init_guard());
  }
  return connector_->precision->module_init_context().then(empty_init_guard(empty_init));
}

}  // namespace lightning::fabric
