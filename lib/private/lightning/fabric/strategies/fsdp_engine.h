// The fsdp strategy's sharding engine, private to the library: which parameters a rank holds,
// the sharding units, and the gather / free / reduce-scatter steps around forward and backward.
// One per FSDPStrategy, which owns it and outlives it. Methods marked collective must be called
// by every rank of the shard group in the same order.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "lightning/fabric/checkpoint/sharded_checkpoint.h"
#include "lightning/fabric/checkpoint/sharded_format.h"
#include "lightning/fabric/checkpoint/state_dict.h"
#include "lightning/fabric/strategies/fsdp.h"

namespace lightning::fabric {

class FSDPStrategy::Engine : public CheckpointLayout {
 public:
  struct ShardedParameter {
    std::string name;
    at::Tensor parameter;  // the module's own parameter: full while materialized, else 0 elements
    std::vector<int64_t> shape;
    int64_t numel = 0;
    int64_t chunk = 0;  // ceil(numel / parts): the padded slot size in communication buffers
    ShardSlice slice;   // this rank's part
    at::Tensor shard;   // 1-D, slice.length elements: what the optimizer steps
    std::shared_ptr<torch::autograd::Node> accumulator;  // kept alive: it carries the unit's hook
    c10::Storage held;  // while released: the full parameter's storage, which autograd still refers to
  };

  // A sharding unit: the parameters gathered, given back and reduced together. Unit 0 holds the
  // set-up module's parameters that no FSDPUnit inside it claims.
  struct Unit {
    torch::nn::Module* module = nullptr;  // an FSDPUnit, or a module called through lf::call; nullptr for unit 0
    std::string name;          // the module's dotted path from the set-up module
    bool via_call = false;     // its hooks run only when the parent calls it through lf::call
    bool entered = false;      // its forward ran since the set-up module's forward started
    std::vector<size_t> parameters;  // indices into ShardedModule::parameters
    bool materialized = true;  // full parameters present
    bool stale = false;        // shards stepped since the last gather
    bool released = false;     // storage given back after the forward; shapes kept for autograd
    bool reduced = false;      // gradients reduced during the current backward
    size_t pending = 0;        // gradient accumulations the current backward still owes
  };

  struct ShardedModule {
    const torch::nn::Module* address = nullptr;
    std::weak_ptr<torch::nn::Module> module;
    std::vector<ShardedParameter> parameters;
    std::vector<Unit> units;
    std::vector<std::shared_ptr<FSDPUnitImpl::Hooks>> hooks;  // one per FSDPUnit (weakly held there)
    bool casts = false;  // some full parameter is gathered in the param dtype, not its shard's
    bool in_forward = false;            // from before_forward to the backward (not its recomputes)
    bool awaiting_backward = false;     // a forward with gradients ran and fabric.backward has not yet
    std::vector<size_t> order, last_order;  // units as this forward and the previous one entered them
  };

  // A gather started ahead of its unit's forward or backward (prefetch); at most one at a time.
  struct Prefetch {
    ShardedModule* sharded = nullptr;
    size_t unit = 0;
    uint64_t version = 0;                // shard_version_ when it started
    std::function<at::Tensor()> finish;  // waits, returns the gathered [parts, slots] buffer
  };

  explicit Engine(FSDPStrategy& strategy) : strategy_(strategy) {}

  /// Materialises a module built on the meta device (collective): parameters whose parameters are
  /// freed keep only this rank's shard, kept here until shard(); the rest get their full values.
  /// slice (if set): what this rank holds of each parameter's full value before sharding.
  void materialize(torch::nn::Module& module, const MaterializeSlice& slice);
  /// Parameters and buffers materialize() gave values that every rank computed alike.
  const std::set<const c10::TensorImpl*>& materialized() const { return materialized_; }
  /// Drops what materialize() kept for the setup that follows it (after that setup, or when it failed).
  void forget_materialized();

  /// input cast to the param dtype when it is floating point and one is in effect.
  at::Tensor cast_input(const at::Tensor& input) const;

  /// Splits a module whose values every rank already shares into this rank's shards. called:
  /// modules (not FSDPUnits) that become units whose hooks run through lf::call.
  void shard(const std::shared_ptr<torch::nn::Module>& module, const std::vector<std::shared_ptr<torch::nn::Module>>& called);
  /// Units made through lf::call that the parent called directly: after a failed forward, those
  /// not reached whose parameters are still shards; after a backward, those not entered whose
  /// parameters got gradients. The message naming them and the fix; empty when there are none.
  std::string skipped_units_hint(const torch::nn::Module& module, bool after_backward);
  /// Points the optimizer at the shards of the parameters it holds.
  void adopt_optimizer(torch::optim::Optimizer& optimizer);
  /// Gathers unit 0 of a set-up module before its forward (collective).
  void before_forward(const torch::nn::Module& module);
  /// A backward starts: unit forwards from now on are recomputes, not the forward's order.
  void end_forwards();
  /// A backward starts with these options: parameters outside a non-empty `inputs` keep their
  /// gradients; retain_graph keeps every unit's full parameters for the next backward.
  void begin_backward(const BackwardOptions& options);
  /// Reduces what the backward left unreduced, in unit order (collective); frees the full
  /// parameters kept for it unless the graph was retained.
  void finish_backward();
  /// A gradient with a graph was taken (Fabric::grad): full parameters stay gathered until the
  /// next backward that does not retain its graph has ended, since that graph saved them.
  void keep_full_parameters() { keep_full_ = true; }
  void mark_stale();
  ScopeGuard summon(const torch::nn::Module& module);  // collective
  int64_t resident_bytes() const;

  ShardedModule* find(const torch::nn::Module& module);
  const ShardedParameter* find_shard(const at::Tensor& shard) const;

  /// The shard or module parameter's entry (nullptr for a tensor this engine does not shard).
  const ShardedParameter* find_parameter(const at::Tensor& tensor) const;

  // Checkpoints (fsdp_checkpoint.cpp): the sharded-checkpoint engine's questions.
  /// A sharded parameter's shard: a flat range of the parameter as this rank holds it (a composed
  /// strategy places that inside its tensor-parallel box); written by the first replica of each
  /// shard.
  std::optional<Placement> placement(const at::Tensor& parameter) const override;
  /// The shard (a copy when it views its full parameter, so the save holds only its elements).
  at::Tensor saved_value(const at::Tensor& parameter) const override;
  /// The name of every parameter an optimizer steps, in its state's index order: the parameter's
  /// name in the module of `state` that holds it (Python FSDP keys optimizer state so), or the
  /// index where no module entry holds it.
  std::vector<std::string> optimizer_parameter_names(const State& state, torch::optim::Optimizer& optimizer) const override;
  /// Copies each placed module tensor (this rank's shard) into its shard, buffers into the module,
  /// and loads the optimizers' state.
  StateDict restore(State& state, const StateDict& local, bool strict) override;


 private:
  class UnitHooks;
  bool frees_parameters() const;  // FULL_SHARD, HYBRID_SHARD
  void hook_accumulators(ShardedModule& sharded, size_t unit);
  void build_units(ShardedModule& sharded, torch::nn::Module& module,
                   const std::vector<std::shared_ptr<torch::nn::Module>>& called);
  /// Collective over the shard group. full_precision: in the shards' dtype (summon), else in
  /// the param dtype.
  void gather(ShardedModule& sharded, Unit& unit, bool full_precision = false);
  bool needs_gather(const ShardedModule& sharded, const Unit& unit) const;
  /// Starts the gather of unit in the param dtype (a prefetch), after settling any other.
  void prefetch(ShardedModule& sharded, size_t unit);
  /// Finishes the prefetch in flight, if any. use: put its values in place when they are still
  /// current (no step or load since it started) and its unit still needs them; true if it did.
  /// Otherwise the values are dropped, so no unit holds full parameters nobody asked for.
  bool settle_prefetch(bool use);
  /// The unit after (forward) or before (backward) unit in the previous forward's order, if any.
  std::optional<size_t> neighbour(const ShardedModule& sharded, size_t unit, bool forward) const;
  /// This rank's part of a unit's parameters, packed for the all-gather ([slots], padded chunks).
  at::Tensor pack_shards(const ShardedModule& sharded, const Unit& unit, bool full_precision) const;
  /// Copies a gathered [parts, slots] buffer into the unit's full parameters.
  void place(ShardedModule& sharded, Unit& unit, const at::Tensor& gathered, bool full_precision);
  c10::ScalarType full_dtype(const ShardedParameter& p, bool full_precision) const;
  void reduce_gradients(ShardedModule& sharded, Unit& unit);  // collective
  void free_full_parameters(ShardedModule& sharded, Unit& unit);
  void release_full_parameters(ShardedModule& sharded, Unit& unit);  // mid-step: autograd may refill
  void unit_before_forward(ShardedModule& sharded, Unit& unit);
  at::Tensor unit_after_forward(ShardedModule& sharded, Unit& unit, at::Tensor output);
  void finish_unit_backward(ShardedModule& sharded, Unit& unit);  // reduce, then free (once per backward)

  // A parameter materialised from the meta device as its shard only (the parameter itself is an
  // 0-element tensor until shard() adopts it).
  struct Preset {
    at::Tensor shard;
    std::vector<int64_t> shape;
  };

  FSDPStrategy& strategy_;
  std::map<const c10::TensorImpl*, Preset> presets_;
  std::set<const c10::TensorImpl*> materialized_;
  FSDPMixedPrecision dtypes_;  // resolved at the first shard()
  std::vector<std::unique_ptr<ShardedModule>> modules_;
  // Every sharded parameter by its shard, and by its shard or module parameter: the optimizer's
  // tensors are looked up per step (clipping) and per checkpoint entry.
  std::unordered_map<const c10::TensorImpl*, const ShardedParameter*> by_shard_, by_tensor_;
  std::optional<Prefetch> prefetch_;
  uint64_t shard_version_ = 0;  // bumped whenever the shards change (a step, a load)
  bool keep_full_ = false;      // no release or free until a backward without retain_graph ends
  bool retaining_ = false;      // the current backward retains its graph
  std::set<const c10::TensorImpl*> only_;  // the current backward's inputs (empty: every parameter)
};

}  // namespace lightning::fabric
