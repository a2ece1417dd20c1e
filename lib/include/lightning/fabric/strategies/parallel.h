// The base of every strategy that runs one process per device ("ddp", "fsdp", and any strategy a
// user adds): what they share lives here once.
//   - ranks: from the cluster environment, or from the devices and nodes under lightning-run;
//   - the launcher: Fabric::launch() spawns this node's other processes when nobody else did;
//   - the process group and its backend choice (ProcessGroupSettings);
//   - shard and replica groups: one group per node and one per local rank across nodes, for
//     strategies that shard inside a node and replicate across nodes;
//   - the tensor and byte collectives Fabric exposes, on the group's device;
//   - gradient-sync skipping for no_backward_sync;
//   - the checkpoint protocol: rank 0 writes, every rank learns the outcome.
// A new multi-process strategy derives from this and overrides only its own behaviour
// (docs/decisions.md, "Adding a strategy").
#pragma once

#include "lightning/fabric/export.h"

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lightning/fabric/plugins/collectives/process_group_settings.h"
#include "lightning/fabric/strategies/strategy.h"

namespace lightning::fabric {

class Collective;  // the process group (private to the library; its tests include collective.h)
class SubprocessLauncher;

/// The groups a data-parallel strategy runs over when a composed strategy (composed.h) places it
/// on a mesh's data dimensions. Null: the world.
struct LF_API DataGroups {
  std::shared_ptr<Collective> data;        // every rank holding the same model part (replicate x shard)
  std::shared_ptr<Collective> shard;       // the ranks a parameter's shards are split over
  std::shared_ptr<Collective> replicate;   // the ranks holding the same shard (HSDP), or null
  std::shared_ptr<Collective> module_copies;  // the ranks that build the same module (a pipeline stage's)
};

class LF_API ParallelStrategy : public Strategy {
 public:
  /// settings: the strategy's options' process_group (checked by the strategy's factory); the
  /// environment's overrides are applied when the group forms (with_environment_overrides).
  ParallelStrategy(StrategyContext context, ProcessGroupSettings settings);
  ~ParallelStrategy() override;

  torch::Device root_device() const override;
  int world_size() const override;
  int global_rank() const override;

  void launch_processes() override;
  /// Forms the process group (once; collective: every rank calls it).
  void setup_environment() override;
  ScopeGuard no_backward_sync(const torch::nn::Module& module, bool enabled) override;
  /// True: every multi-process strategy synchronises gradients over its ranks. A derived strategy
  /// that does not (each rank trains its own model) overrides this with false.
  bool averages_gradients() const override { return true; }

  void barrier(const std::string& name = {}) override;
  at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  at::Tensor all_gather(const at::Tensor& tensor) override;
  at::Tensor broadcast(const at::Tensor& tensor, int src) override;
  std::string broadcast_bytes(const std::string& bytes, int src) override;

  /// Runs this strategy on a process group formed by another (a composed strategy's world) and
  /// the given groups of it: setup_environment then forms nothing. Not collective.
  void run_on(std::shared_ptr<Collective> world, DataGroups groups);
  /// The process group over every rank (after setup_environment; RuntimeError before).
  Collective& collective();
  /// The ranks that hold the same model (or model part) and average its gradients: the world, or
  /// DataGroups::data. The ranks that build the same module: the world, or DataGroups::module_copies.
  Collective& data_group();
  const std::shared_ptr<Collective>& shared_data_group();
  Collective& module_copies_group();
  /// The group a shard is split over: this node's ranks once use_node_groups() ran, or
  /// DataGroups::shard, else the world.
  Collective& shard_group();
  /// The group over this local rank on every node once use_node_groups() ran, or
  /// DataGroups::replicate, else null.
  Collective* replica_group() const { return replica_group_.get(); }
  /// Collectives issued so far over every group of this strategy (tests count them).
  virtual uint64_t operation_count() const;
  const ProcessGroupSettings& process_group_settings() const { return settings_; }

 protected:
  int num_processes() const { return static_cast<int>(context_.parallel_devices.size()); }
  /// Makes the shard group one node's ranks and the replica group one local rank's peers on every
  /// node (collective, once). `prefix` names the groups in hang reports.
  void use_node_groups(const std::string& prefix);
  /// Checks that every rank passes the same parameters and buffers, then copies rank 0's values
  /// to every rank (collective; Fabric::setup of every data-parallel strategy). Tensors in
  /// already_equal (every rank computed the same values, e.g. replayed from one meta build) are
  /// checked but not copied. group: the ranks that hold the same model (default: every rank).
  void broadcast_module_from_rank_zero(torch::nn::Module& module,
                                       const std::set<const c10::TensorImpl*>& already_equal = {},
                                       Collective* group = nullptr);
  /// False while no_backward_sync is active for module.
  bool syncs_gradients_of(const torch::nn::Module* module) const { return sync_disabled_.count(module) == 0; }
  const std::shared_ptr<Collective>& shared_collective() const { return collective_; }
  /// The shard group when one was made (use_node_groups, run_on), else null.
  const Collective* formed_shard_group() const { return shard_group_.get(); }

 private:
  ProcessGroupSettings settings_;
  std::unique_ptr<SubprocessLauncher> launcher_;
  std::shared_ptr<Collective> collective_;
  std::shared_ptr<Collective> shard_group_;    // null: the world
  std::shared_ptr<Collective> replica_group_;  // null: no replicas
  std::shared_ptr<Collective> data_group_, module_copies_group_;  // null: the world
  std::set<const torch::nn::Module*> sync_disabled_;
};

}  // namespace lightning::fabric
