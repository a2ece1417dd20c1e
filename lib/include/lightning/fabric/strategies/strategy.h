// Strategies: how the model, optimizers and gradients are laid out over processes and devices.
// The base class holds what every strategy shares (accelerator, cluster environment, precision,
// the devices of this node, the checkpoint protocol) and implements single-process behaviour for
// the collectives; multi-process strategies derive from ParallelStrategy (parallel.h). Built by
// the Connector through strategy_registry().
#pragma once

#include "lightning/fabric/export.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lightning/fabric/accelerators/accelerator.h"
#include "lightning/fabric/checkpoint/checkpoint_write.h"
#include "lightning/fabric/checkpoint/state_fwd.h"
#include "lightning/fabric/plugins/environments/cluster_environment.h"
#include "lightning/fabric/plugins/precision/precision.h"
#include "lightning/fabric/reduce_op.h"
#include "lightning/fabric/registry.h"
#include "lightning/fabric/utilities/env_vars.h"
#include "lightning/fabric/utilities/fused_step.h"
#include "lightning/fabric/utilities/module_policy.h"
#include "lightning/fabric/utilities/scope_guard.h"

namespace lightning::fabric {

/// Everything a strategy factory receives from the Connector.
struct LF_API StrategyContext {
  std::shared_ptr<Accelerator> accelerator;
  std::shared_ptr<ClusterEnvironment> cluster_environment;
  std::shared_ptr<Precision> precision;
  std::vector<torch::Device> parallel_devices;  // this node's devices, one per local process
  int num_nodes = 1;
  env::EnvLookup env = env::process_env();      // the environment the Connector resolved with
};

class BackgroundWrite;  // checkpoint/background_write.h
class CheckpointLayout;  // where each tensor lies (private to the library: checkpoint/sharded_checkpoint.h)
class HostBufferPool;

class LF_API Strategy {
 public:
  explicit Strategy(StrategyContext context);
  virtual ~Strategy();

  virtual std::string name() const = 0;
  /// The device this process computes on.
  virtual torch::Device root_device() const = 0;

  const std::shared_ptr<Accelerator>& accelerator() const { return context_.accelerator; }
  const std::shared_ptr<ClusterEnvironment>& cluster_environment() const { return context_.cluster_environment; }
  const std::shared_ptr<Precision>& precision() const { return context_.precision; }
  const std::vector<torch::Device>& parallel_devices() const { return context_.parallel_devices; }
  int num_nodes() const { return context_.num_nodes; }

  virtual int world_size() const { return context_.cluster_environment->world_size(); }
  virtual int global_rank() const { return context_.cluster_environment->global_rank(); }
  virtual int local_rank() const { return context_.cluster_environment->local_rank(); }
  virtual int node_rank() const { return context_.cluster_environment->node_rank(); }
  bool is_global_zero() const { return global_rank() == 0; }

  /// Once per process, before any setup: the accelerator's device setup, process groups, ...
  virtual void setup_environment();
  /// The devices a FabricModule's forward splits each batch over within this process ("dp");
  /// empty for every strategy that runs one device per process.
  virtual const std::vector<torch::Device>& data_parallel_devices() const;

  /// Spawns this node's other local processes when nobody else did (Fabric::launch). Default:
  /// nothing, the strategy runs one process.
  virtual void launch_processes() {}
  /// Skips the gradient synchronisation of `module` while the guard lives (accumulation).
  /// Default: a no-op with a warning (single_device is silent, as Python).
  virtual ScopeGuard no_backward_sync(const torch::nn::Module& module, bool enabled);
  /// Whether backward averages gradients across processes (ddp, fsdp: every ParallelStrategy
  /// running more than one process). Fabric::backward then refuses a loss that no set-up model
  /// produced, whose gradients would silently stay local. Default: false (one process).
  virtual bool averages_gradients() const { return false; }
  /// Strategies that must see module and optimizers together (Python: DeepSpeed, XLA) say so;
  /// Fabric then refuses setup_module()/setup_optimizers().
  virtual bool requires_joint_setup() const { return false; }
  /// Moves the module to root_device() (called by Fabric::setup unless move_to_device=false).
  virtual void module_to_device(torch::nn::Module& module) const;
  /// Whether Fabric::init_module(true) builds on the meta device for this strategy (meta_init.h)
  /// instead of skipping random fills (empty_init.h). fsdp: true.
  virtual bool builds_on_meta_device() const { return false; }
  /// Gives a module built on the meta device its values, first thing in Fabric::setup (before the
  /// precision's cast and the move to the device). Default: every full value (materialize_module).
  virtual void materialize_meta_tensors(torch::nn::Module& module);
  /// Wraps/attaches to the module for this strategy (DDP: gradient reducer). Default: nothing.
  virtual void setup_module(const std::shared_ptr<torch::nn::Module>& module) { (void)module; }
  /// The submodules Fabric::setup checkpoints when SetupOptions names none (activation_checkpoint.h).
  virtual ModulePolicy activation_checkpointing() const { return {}; }
  /// Prepares an optimizer built over the set-up module's parameters. Default: nothing.
  virtual void setup_optimizer(torch::optim::Optimizer& optimizer) { (void)optimizer; }

  /// Backward through the precision plugin. module is the FabricModule's inner module, or null.
  /// A strategy refuses what it cannot do (ValueError naming the option and the fix).
  virtual void backward(at::Tensor& loss, torch::nn::Module* module, const BackwardOptions& options);
  /// Before Fabric::grad's autograd call. create_graph: the gradient will be differentiated again
  /// in the next backward, so what its graph saved must stay valid until then. Default: nothing.
  virtual void before_grad(bool create_graph) { (void)create_graph; }
  /// One optimizer step through the precision plugin, run by the given kernel (fused_step.h);
  /// false when the step was skipped.
  virtual bool optimizer_step(torch::optim::Optimizer& optimizer,
                              const torch::optim::Optimizer::LossClosure& closure = nullptr,
                              StepKernel kernel = StepKernel::LibTorch);

  // Collectives. Every process of the group must call them (they are collective); on a single
  // process they return their input (all_gather adds no dimension there). Tensors on any device:
  // results come back on the input's device (see Collective for how they cross to the group's).
  virtual void barrier(const std::string& name = {}) { (void)name; }
  virtual at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op) { (void)op; return tensor; }
  virtual at::Tensor all_gather(const at::Tensor& tensor) { return tensor; }
  virtual at::Tensor broadcast(const at::Tensor& tensor, int src) { (void)src; return tensor; }
  /// Broadcasts raw bytes (serialised objects) from src to every rank.
  virtual std::string broadcast_bytes(const std::string& bytes, int src) { (void)src; return bytes; }

  // Checkpoints (collective). Default: rank 0 writes one file, every rank reads it.
  /// fabric.save and fabric.save_in_background: waits for a background save in flight
  /// (settle_background_save), prepares (prepare_checkpoint), then runs the write here, or on a
  /// background thread when in_background (after which it returns), and the commit. A failure on
  /// any rank is raised on every rank as "<call> failed on rank R: <why>".
  void save_checkpoint(const std::filesystem::path& path, const State& state, const StateFilter& filter,
                       bool in_background = false);
  /// Collective. Fabric calls it with wait=false first thing in barrier, all_reduce, all_gather,
  /// broadcast, backward and rank_zero_first, and with wait=true in save, load,
  /// wait_for_background_save and its destructor. With a background
  /// save in flight: wait=true waits for this rank's write; wait=false returns at once unless every
  /// rank's write has finished. Once they have, every rank learns the outcome, the commit runs, and
  /// a failure is raised on every rank alike. Without one: nothing, no communication.
  void settle_background_save(bool wait);
  /// Not collective. Waits for this rank's background write and discards it uncommitted; for
  /// destructors and unwinding, where the other ranks may not take part in a commit.
  void abandon_background_save();
  /// With state: restores it in place and returns the unrequested entries; without: the whole
  /// checkpoint as stored.
  virtual StateDict load_checkpoint(const std::filesystem::path& path, State* state, bool strict);

  /// Called by FabricModule before every forward of a set-up module (sharded strategies gather
  /// parameters here). Default: nothing.
  virtual void before_forward(const torch::nn::Module& module) { (void)module; }
  /// A set-up module's input after the precision plugin converted it (fsdp casts it to its
  /// param_dtype); identity by default.
  virtual at::Tensor convert_input(const at::Tensor& input) const { return input; }
  /// A set-up module's forward threw `error`, which propagates unchanged after this returns: a
  /// strategy that knows a likely cause writes it to stderr (fsdp: units skipped by the parent).
  virtual void annotate_forward_error(const torch::nn::Module& module, const std::exception& error) {
    (void)module, (void)error;
  }
  /// Scales gradients so their global norm_type-norm is at most max_norm; returns the norm before
  /// clipping. parameters: those of one optimizer (shards under fsdp, where the norm is global).
  virtual double clip_gradients_by_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                                        bool error_if_nonfinite);
  /// How fabric.setup_dataloaders splits a data set (Python's distributed_sampler_kwargs): into
  /// `replicas` shares, this rank reading share `rank`. Default: every rank its own share; ranks
  /// that hold parts of one model replica (model_parallel's tensor group) read the same one.
  struct SamplerShare {
    int replicas = 1;
    int rank = 0;
  };
  virtual SamplerShare sampler_share() const { return {world_size(), global_rank()}; }
  /// The tensors this rank trains for a set-up module, by parameter name: its parameters; under
  /// fsdp their shards (non-finite detection and spike checks read them).
  virtual std::vector<std::pair<std::string, at::Tensor>> trained_tensors(const torch::nn::Module& module);
  /// One tensor this rank trains for a parameter of a set-up module, and how values shaped like
  /// it relate to the parameter's full value: what a callback that keeps a value per parameter
  /// (lf::EMA) asks the strategy instead of its type.
  struct TrainedPart {
    std::string name;                 // the parameter's, as in the module's named_parameters()
    std::vector<int64_t> full_shape;  // the whole parameter's, over every rank
    at::Tensor tensor;                // what the optimizer steps here (trained_tensors)
    /// The full value (full_shape, a new tensor) from every rank's values shaped like tensor.
    /// Collective over the ranks that hold parts of the parameter: every rank calls it for the
    /// same parts, in the same order.
    std::function<at::Tensor(const at::Tensor& values)> gather;
    /// This rank's part of a full value (full_shape), shaped like tensor. Not collective.
    std::function<at::Tensor(const at::Tensor& full)> cut;
  };
  /// The parts of a set-up module's parameters this rank trains (trained_tensors), in
  /// named_parameters() order, read from placements(): a tensor without a placement is whole
  /// (gather clones, cut returns the full value); a placed one is gathered by its writer placing
  /// its value in a zero tensor of the full shape, summed over the world, and cut by its
  /// placement. ValueError where no rank can give every full value (the pipeline).
  std::vector<TrainedPart> trained_parts(const torch::nn::Module& module);
  /// The tensors of trained_parts were written outside an optimizer step (averaged weights swapped
  /// in): fsdp gathers its shards again before the next forward. Not collective. Default: nothing.
  virtual void trained_tensors_changed() {}
  /// A composed strategy's data-parallel part (the ddp or fsdp strategy on its mesh's data
  /// dimensions, composed.h); null for every other strategy. strategy_cast looks there too.
  virtual Strategy* data_parallel_part() const { return nullptr; }
  /// The one placement function: where this rank's value of each tensor it trains (and of its
  /// optimizer state and buffers) lies in the whole tensor, and whether this rank writes it (one
  /// replica of every part does). The checkpoint engine, clip_gradients_by_norm and trained_parts
  /// (lf::EMA) read it. Null (the default): every tensor whole and equal on every rank. fsdp: its
  /// shards' flat ranges; the composed strategy: each part's factor composed (composed.h).
  virtual CheckpointLayout* placements() { return nullptr; }

  // The checkpoint protocol of every strategy (collective; each is also a barrier), which the
  // sharded-checkpoint engine and a user's own strategy use alike. A failure of any kind
  // (c10::Error, std::exception) becomes the same RuntimeError on every rank:
  // "<call> failed on rank R: <why>", so no rank goes on while another lost the file.
  /// Runs action on rank 0 only.
  void run_on_rank_zero(const std::string& call, const std::function<void()>& action);
  /// Runs action on every rank; the lowest failing rank's reason reaches all.
  void run_on_every_rank(const std::string& call, const std::function<void()>& action);

 protected:
  /// The collective first part of a save: gathers or shards what it needs, and returns the steps
  /// that finish it. call names the Fabric call for messages. host_copy: the write will run on a
  /// background thread, so it must hold its own copy of every tensor (host_copy in
  /// checkpoint/background_write.h); otherwise it may read the live state. Default: rank 0 writes
  /// one file atomically (checkpoint/checkpoint_io.h).
  virtual CheckpointWrite prepare_checkpoint(const std::string& call, const std::filesystem::path& path,
                                             const State& state, const StateFilter& filter, bool host_copy);

  StrategyContext context_;

 private:
  /// Every rank's write is done (or failed): agree on the outcome, then commit or discard.
  void finish_checkpoint(const std::string& call, CheckpointWrite& steps, std::exception_ptr write_error);

  std::unique_ptr<BackgroundWrite> background_write_;  // the save in flight, if any
  CheckpointWrite background_steps_;                   // its commit and discard
  std::unique_ptr<HostBufferPool> host_buffers_;       // the last background save's host copy, for the next
};

/// One process, one device: "single_device".
class LF_API SingleDeviceStrategy : public Strategy {
 public:
  explicit SingleDeviceStrategy(StrategyContext context);
  std::string name() const override { return "single_device"; }
  torch::Device root_device() const override { return context_.parallel_devices.front(); }
  /// As Python: one device has nothing to synchronise, so nothing to warn about either.
  ScopeGuard no_backward_sync(const torch::nn::Module& module, bool enabled) override {
    (void)module, (void)enabled;
    return ScopeGuard();
  }
};

using StrategyRegistry = Registry<Strategy, StrategyContext>;
/// The process-wide strategy registry, filled with the built-in strategies on first use
/// (src/builtin_registrations.cpp).
LF_API StrategyRegistry& strategy_registry();

/// Every strategy name the Connector accepts: "auto", then the registry's names in order.
LF_API std::vector<std::string> strategy_choices();

/// The strategy as its concrete type, e.g. fabric.strategy_as<FSDPStrategy>() (strategy_as in
/// fabric.h), or its data-parallel part as that type (fsdp under model_parallel); TypeError
/// naming the active strategy when neither is a T.
template <class T>
T& strategy_cast(Strategy& strategy, const char* wanted) {
  auto* cast = dynamic_cast<T*>(&strategy);
  if (cast == nullptr && strategy.data_parallel_part() != nullptr) cast = dynamic_cast<T*>(strategy.data_parallel_part());
  LF_CHECK(cast != nullptr, TypeError, "The active strategy is '", strategy.name(), "', which is not a ", wanted,
           ". Choose a strategy of that type in FabricOptions().strategy(...) (or lightning-run --strategy).");
  return *cast;
}

}  // namespace lightning::fabric
