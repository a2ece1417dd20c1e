// "fsdp": fully sharded data parallel (ZeRO) on c10d, a sibling of ddp under ParallelStrategy
// (parallel.h), with its own process-group settings. Every
// parameter is flattened and split into world-size chunks of ceil(numel / world) elements;
// rank r owns chunk r (the last chunks may be short or empty). The optimizer steps over the
// owned chunks only ("shards"), so optimizer state is sharded; gradients are averaged over all
// ranks and only the owned chunk is kept. Sharding strategies (Python's names):
//   FULL_SHARD     parameters, gradients and optimizer state sharded; full parameters exist only
//                  from a forward until its backward ended (gathered before the forward)
//   SHARD_GRAD_OP  gradients and optimizer state sharded; full parameters stay (shards are views
//                  of them); refreshed from the other ranks' shards before the next forward
//   NO_SHARD       nothing sharded: DDP, with gradients averaged after backward
//   HYBRID_SHARD   FULL_SHARD inside each node, replicated across nodes (a shard group per node,
//                  gradients of a shard averaged over its replicas on the other nodes)
// Sharding units: the set-up module, plus every FSDPUnit inside it (declared by the model or made
// by auto_wrap_min_params or auto_wrap) and every module auto_wrap made a unit in place (called
// through lf::call); a unit's full parameters exist only from its forward's start to its
// end, and again from the backward reaching it until its gradients are reduce-scattered. Between
// a backward and the next forward, a FULL_SHARD module's parameters have zero elements: read
// weights through fabric.save / load, or after a forward.
#pragma once

#include "lightning/fabric/export.h"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lightning/fabric/options.h"
#include "lightning/fabric/strategies/fsdp_unit.h"
#include "lightning/fabric/strategies/parallel.h"

namespace lightning::fabric {

enum class ShardingStrategy { FullShard, ShardGradOp, NoShard, HybridShard };
/// "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD" (ValueError for others).
LF_API ShardingStrategy parse_sharding_strategy(const std::string& name);
LF_API std::string to_string(ShardingStrategy strategy);

/// The dtypes fsdp computes and communicates in (Python's MixedPrecision). Shards, their gradients
/// and the optimizer state stay in the parameters' own dtype (float32: the master copy). Unset
/// param_dtype and buffer_dtype are taken from the precision plugin as Python Fabric takes them
/// ("bf16-mixed" and "bf16-true": bfloat16; "16-mixed" and "16-true": float16; otherwise the
/// parameters' own dtype, no cast); an unset reduce_dtype is param_dtype.
struct LF_API FSDPMixedPrecision {
  /// Full parameters gathered for forward and backward, and each unit's floating-point inputs.
  std::optional<c10::ScalarType> param_dtype;
  /// Gradients reduce-scattered (all-reduced under NO_SHARD) in this dtype, then added to the
  /// shards' gradients in theirs.
  std::optional<c10::ScalarType> reduce_dtype;
  /// Floating-point buffers, cast once at setup (checkpoints then hold them in this dtype).
  std::optional<c10::ScalarType> buffer_dtype;
};

/// options with param_dtype and buffer_dtype, when unset, filled from the precision named
/// precision_name (as above), and reduce_dtype, when unset, set to param_dtype, as in Python.
LF_API FSDPMixedPrecision resolve_mixed_precision(FSDPMixedPrecision options, const std::string& precision_name);

struct LF_API FSDPOptions {
  ShardingStrategy sharding_strategy = ShardingStrategy::FullShard;
  /// Timeouts, backend and hang detection of the process group (process_group_settings.h).
  ProcessGroupSettings process_group;
  /// "sharded": fabric.save writes a folder, one shard file per rank plus metadata (fast, every
  /// rank writes in parallel). "full": rank 0 gathers everything and writes one file.
  std::string state_dict_type = "sharded";
  /// Automatic sharding units (Python's size_based_auto_wrap_policy): at setup, every child of a
  /// Sequential inside the module that holds at least this many parameters becomes an FSDPUnit.
  /// 0 (the default): only the units the model declares itself (fsdp_unit.h).
  int64_t auto_wrap_min_params = 0;
  /// Sharding units by layer type or name (Python's auto_wrap_policy={Block}): at setup, every
  /// submodule the policy matches, anywhere in the tree, becomes a unit. A child of a Sequential is
  /// wrapped in an FSDPUnit; any other match (blocks in a vector, a ModuleList, named members) must
  /// be called through lf::call(block, x) by its parent, which runs the unit's gather and release
  /// (module_call.h). A parent that skips it is named: under FULL_SHARD the forward fails (its
  /// shards are empty) and stderr says why; otherwise fabric.backward throws RuntimeError. Empty: none.
  ModulePolicy auto_wrap;
  /// Compute and communication dtypes (see FSDPMixedPrecision); the default follows the precision.
  FSDPMixedPrecision mixed_precision;
  /// Prefetching (Python's forward_prefetch and backward_prefetch=BACKWARD_PRE): while a unit
  /// computes, the all-gather of the unit that runs next (in the order of the previous forward)
  /// is already in flight, on the process group's own thread. Costs one more unit's full
  /// parameters at a time; changes no value. Forward: off by default, as in Python. Backward: on.
  bool forward_prefetch = false;
  bool backward_prefetch = true;
  /// Submodules whose activations are recomputed in backward (Python's
  /// activation_checkpointing_policy; activation_checkpoint.h), e.g.
  /// lf::ModulePolicy::of_type<BlockImpl>(); empty: none. Inside a unit, the gathered parameters
  /// are reused by the recompute. SetupOptions::activation_checkpointing wins.
  ModulePolicy activation_checkpointing;
};

/// FSDP with settings, for FabricOptions().strategy(...). ValueError for a bad state_dict_type.
LF_API StrategySpec fsdp_strategy(FSDPOptions options = FSDPOptions());

class CheckpointLayout;  // the sharded-checkpoint engine's questions (private to the library)
/// What a parameter's full value becomes on this rank before it is sharded (e.g. its
/// tensor-parallel slice): (name, full value) -> the value held.
using MaterializeSlice = std::function<at::Tensor(const std::string& name, const at::Tensor& full)>;

class LF_API FSDPStrategy : public ParallelStrategy {
 public:
  FSDPStrategy(StrategyContext context, FSDPOptions options = FSDPOptions());
  ~FSDPStrategy() override;
  std::string name() const override { return "fsdp"; }
  const FSDPOptions& fsdp_options() const { return fsdp_options_; }
  ModulePolicy activation_checkpointing() const override { return fsdp_options_.activation_checkpointing; }

  /// init_module(true) builds on the meta device; setup then materialises each parameter's full
  /// value one at a time (replaying the build) and keeps this rank's shard of it under FULL_SHARD
  /// and HYBRID_SHARD (the whole value under SHARD_GRAD_OP and NO_SHARD, which keep full
  /// parameters anyway). Collective: rank 0's generator state is broadcast first.
  bool builds_on_meta_device() const override { return true; }
  void materialize_meta_tensors(torch::nn::Module& module) override;
  void setup_module(const std::shared_ptr<torch::nn::Module>& module) override;
  void setup_optimizer(torch::optim::Optimizer& optimizer) override;
  void before_forward(const torch::nn::Module& module) override;
  void annotate_forward_error(const torch::nn::Module& module, const std::exception& error) override;
  at::Tensor convert_input(const at::Tensor& input) const override;
  /// The dtypes in effect: FSDPOptions::mixed_precision with the unset fields filled from the
  /// precision plugin (nullopt: no cast).
  FSDPMixedPrecision effective_mixed_precision() const;
  void backward(at::Tensor& loss, torch::nn::Module* module, const BackwardOptions& options) override;
  void before_grad(bool create_graph) override;
  bool optimizer_step(torch::optim::Optimizer& optimizer,
                      const torch::optim::Optimizer::LossClosure& closure = nullptr,
                      StepKernel kernel = StepKernel::LibTorch) override;

  /// Saves (prepare_checkpoint) and loads "sharded" checkpoints, a folder written by every
  /// shard-holding rank, and "full" ones, one file written by rank 0
  /// (lib/src/strategies/fsdp_checkpoint.cpp).
  StateDict load_checkpoint(const std::filesystem::path& path, State* state, bool strict) override;

  /// Ranks that share the shards of a parameter (all, or one node's under HYBRID_SHARD), and this
  /// rank's place among them.
  int shard_group_size() const;
  int shard_group_rank() const;
  /// Gathers every full parameter of a set-up module (every unit) until the guard ends, then
  /// shards them again (Python's summon_full_params). Collective: every rank calls it. Run no
  /// forward inside it. Reach it through fabric.strategy_as<lf::FSDPStrategy>().
  ScopeGuard summon_full_parameters(const torch::nn::Module& module);
  /// Bytes of parameters, gradients and optimizer state this rank holds for the set-up modules
  /// and optimizers (benchmark P6).
  int64_t resident_bytes() const;

  /// This rank's part of one parameter: `shard` (1-D, what the optimizer steps, in the master
  /// dtype) holds elements [offset, offset + shard.numel()) of the flattened full parameter.
  struct LocalShard {
    std::string name;            // as in the set-up module's named_parameters()
    std::vector<int64_t> shape;  // the full parameter's
    int64_t offset = 0;
    at::Tensor shard;
  };
  /// The shards of a set-up module's parameters, in named_parameters() order (ValueError for a
  /// module not set up with this strategy). Not collective.
  std::vector<LocalShard> local_shards(const torch::nn::Module& module);
  /// The full value of a per-shard tensor (values: shaped like that parameter's shard, e.g. a
  /// moving average of it), gathered over the shard group into the parameter's shape. Collective
  /// over the shard group, in the same order on every rank.
  at::Tensor gather_full(const LocalShard& parameter, const at::Tensor& values);
  /// Shards written outside an optimizer step (e.g. averaged weights swapped in): the next
  /// forward or summon_full_parameters gathers them again. Not collective.
  void shards_changed();
  /// This rank's shards are what it trains (Strategy::trained_tensors; trained_parts reads their
  /// placements); shards written outside a step reach the next forward (shards_changed).
  std::vector<std::pair<std::string, at::Tensor>> trained_tensors(const torch::nn::Module& module) override;
  void trained_tensors_changed() override { shards_changed(); }

  // For a composed strategy that runs fsdp on its mesh's data dimensions (composed.h).
  /// Materialises a meta-built module as materialize_meta_tensors does: the units are made (from
  /// the parameters' shapes now), then before_replay runs (if set), then each parameter's full
  /// value is cut by slice (if set; name, full value -> what this rank holds before sharding, its
  /// tensor-parallel part) and this rank keeps its shard of that.
  void materialize_sliced(torch::nn::Module& module, const MaterializeSlice& slice,
                          const std::function<void()>& before_replay = nullptr);
  /// The set-up module's parameter of `tensor` (its shard, or the parameter itself); undefined
  /// when fsdp does not shard it.
  at::Tensor parameter_of(const at::Tensor& tensor) const;
  /// Where this rank's shard of a parameter (or its optimizer state) lies in the parameter as
  /// this rank holds it: a flat range, written by the first replica of the shard; nullopt for a
  /// tensor fsdp does not shard (Strategy::placements; the sharding engine answers).
  CheckpointLayout* placements() override;

 protected:
  class Engine;  // the sharding state and its operations (lib/private/lightning/fabric/strategies/fsdp_engine.h)
  std::unique_ptr<Engine> engine_;

 private:
  /// Saves and loads through the sharded-checkpoint engine, the Engine telling it each shard's place
  /// (lib/src/strategies/fsdp_checkpoint.cpp).
  CheckpointWrite prepare_checkpoint(const std::string& call, const std::filesystem::path& path, const State& state,
                                     const StateFilter& filter, bool host_copy) override;
  /// FSDPOptions' automatic units made in module; returns the ones called through lf::call.
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_units(torch::nn::Module& module);

  FSDPOptions fsdp_options_;
  // Units made by materialize_meta_tensors, for the setup_module that follows it.
  std::map<const torch::nn::Module*, std::vector<std::shared_ptr<torch::nn::Module>>> wrapped_before_materializing_;
};

}  // namespace lightning::fabric
