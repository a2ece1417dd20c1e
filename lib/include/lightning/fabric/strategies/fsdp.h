// "fsdp": fully sharded data parallel (ZeRO) on c10d, gloo on CPU and NCCL on CUDA. Every
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
// by auto_wrap_min_params); a unit's full parameters exist only from its forward's start to its
// end, and again from the backward reaching it until its gradients are reduce-scattered. Between
// a backward and the next forward, a FULL_SHARD module's parameters have zero elements: read
// weights through fabric.save / load, or after a forward.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "lightning/fabric/checkpoint/sharded_format.h"
#include "lightning/fabric/strategies/ddp.h"
#include "lightning/fabric/strategies/fsdp_unit.h"

namespace lightning::fabric {

enum class ShardingStrategy { FullShard, ShardGradOp, NoShard, HybridShard };
/// "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD" (ValueError for others).
ShardingStrategy parse_sharding_strategy(const std::string& name);
std::string to_string(ShardingStrategy strategy);

struct FSDPOptions {
  ShardingStrategy sharding_strategy = ShardingStrategy::FullShard;
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  std::chrono::milliseconds rendezvous_timeout = std::chrono::minutes(5);  // as DDPOptions'
  std::chrono::milliseconds hang_timeout = std::chrono::minutes(5);        // as DDPOptions'
  std::optional<std::string> process_group_backend;                        // as DDPOptions'
  /// "sharded": fabric.save writes a folder, one shard file per rank plus metadata (fast, every
  /// rank writes in parallel). "full": rank 0 gathers everything and writes one file.
  std::string state_dict_type = "sharded";
  /// Automatic sharding units (Python's size_based_auto_wrap_policy): at setup, every child of a
  /// Sequential inside the module that holds at least this many parameters becomes an FSDPUnit.
  /// 0 (the default): only the units the model declares itself (fsdp_unit.h).
  int64_t auto_wrap_min_params = 0;
};

/// FSDP with settings, for FabricOptions().strategy(...). ValueError for a bad state_dict_type.
StrategySpec fsdp_strategy(FSDPOptions options = FSDPOptions());

class FSDPStrategy : public DDPStrategy {
 public:
  FSDPStrategy(StrategyContext context, FSDPOptions options = FSDPOptions());
  ~FSDPStrategy() override;
  std::string name() const override { return "fsdp"; }
  const FSDPOptions& fsdp_options() const { return fsdp_options_; }

  void setup_module(const std::shared_ptr<torch::nn::Module>& module) override;
  void setup_optimizer(torch::optim::Optimizer& optimizer) override;
  void before_forward(const torch::nn::Module& module) override;
  void backward(at::Tensor& loss, torch::nn::Module* module) override;
  bool optimizer_step(torch::optim::Optimizer& optimizer,
                      const torch::optim::Optimizer::LossClosure& closure = nullptr) override;
  double clip_gradients_by_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                                bool error_if_nonfinite) override;

  void save_checkpoint(const std::filesystem::path& path, const State& state, const StateFilter& filter) override;
  StateDict load_checkpoint(const std::filesystem::path& path, State* state, bool strict) override;

  /// Ranks that share the shards of a parameter (all, or one node's under HYBRID_SHARD), and this
  /// rank's place among them.
  int shard_group_size() const;
  int shard_group_rank() const;
  /// Gathers every full parameter of a set-up module (every unit) until the guard ends, then
  /// shards them again (Python's summon_full_params). Collective: every rank calls it. Run no
  /// forward inside it.
  ScopeGuard summon_full_parameters(const torch::nn::Module& module);
  /// Bytes of parameters, gradients and optimizer state this rank holds for the set-up modules
  /// and optimizers (benchmark P6).
  int64_t resident_bytes() const;
  /// Collectives issued so far over every group fsdp uses (the world, and HYBRID_SHARD's shard and
  /// replica groups): tests check that a backward under no_backward_sync reduces nothing.
  uint64_t operation_count() const;

  struct ShardedParameter;
  struct Unit;
  struct ShardedModule;

 private:
  class UnitHooks;
  bool frees_parameters() const;  // FULL_SHARD, HYBRID_SHARD
  bool syncing(const ShardedModule& sharded) const;
  void build_units(ShardedModule& sharded, torch::nn::Module& module);
  void gather(ShardedModule& sharded, Unit& unit);  // collective over the shard group
  void reduce_gradients(ShardedModule& sharded, Unit& unit);  // collective
  void free_full_parameters(ShardedModule& sharded, Unit& unit);
  void release_full_parameters(ShardedModule& sharded, Unit& unit);  // mid-step: autograd may refill
  void unit_before_forward(ShardedModule& sharded, Unit& unit);
  at::Tensor unit_after_forward(ShardedModule& sharded, Unit& unit, at::Tensor output);
  void finish_unit_backward(ShardedModule& sharded, Unit& unit);  // reduce, then free (once per backward)
  void mark_stale();
  ShardedModule* find(const torch::nn::Module& module);
  const ShardedParameter* find_shard(const at::Tensor& shard) const;
  /// The checkpoint as this rank holds it (shard tensors for sharded entries) and, per sharded
  /// tensor path, its global shape.
  StateDict local_checkpoint(const State& state, const StateFilter& filter,
                             std::map<std::string, std::vector<int64_t>>& global_shapes);
  /// Turns a checkpoint whose sharded tensors are whole into this rank's slices, restores.
  StateDict restore_local(State& state, const StateDict& whole_or_local, bool strict, bool tensors_are_local);

  FSDPOptions fsdp_options_;
  std::vector<std::unique_ptr<ShardedModule>> modules_;
  std::shared_ptr<Collective> shard_group_;    // HYBRID_SHARD: this node's ranks
  std::shared_ptr<Collective> replica_group_;  // HYBRID_SHARD: this local rank on every node
};

}  // namespace lightning::fabric
