// Distributed data parallel: one process per device, parameters broadcast from rank 0 at setup,
// gradients averaged over all ranks during fabric.backward: bucketed all-reduces start as soon as
// a bucket's gradients are ready, overlapping with the rest of backward (internal/gradient_reducer). Process groups come from plugins/collectives (gloo on CPU, NCCL on CUDA).
// When nothing launched the processes (no LOCAL_RANK), Fabric::launch() spawns them through the
// SubprocessLauncher and this process continues as local rank 0.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lightning/fabric/options.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/launchers/subprocess_launcher.h"
#include "lightning/fabric/strategies/strategy.h"

namespace lightning::fabric {

namespace internal {
class GradientReducer;
}

struct DDPOptions {
  std::string name = "ddp";
  bool find_unused_parameters = false;   // a parameter without a gradient counts as zero
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;         // small, so the first all-reduce starts early in backward
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  // of every collective and the store
  /// How long ranks wait for each other to join the process group; a rank that never arrives (it
  /// failed before joining) ends the job after this, naming it. LT_RENDEZVOUS_TIMEOUT (seconds) wins.
  std::chrono::milliseconds rendezvous_timeout = std::chrono::minutes(5);
  /// A rank blocked in one collective this long is a hang: the job is reported and ended with exit
  /// code 86 (docs/launcher.md, "When a job hangs"). 0 turns detection off. LT_HANG_TIMEOUT
  /// (seconds; lightning-run --hang-timeout) wins.
  std::chrono::milliseconds hang_timeout = std::chrono::minutes(5);
  /// "gloo" | "nccl" | "shm". Default: nccl on CUDA; on CPU shm when every rank is on one machine
  /// (checked when the group forms), else gloo. LT_PROCESS_GROUP_BACKEND wins.
  std::optional<std::string> process_group_backend;
};

/// DDP with settings, for FabricOptions().strategy(...):
///   lf::DDPOptions ddp;
///   ddp.timeout = std::chrono::minutes(5);
///   ddp.bucket_cap_mb = 50;
///   lf::Fabric fabric(lf::FabricOptions().strategy(lf::ddp_strategy(ddp)));
/// Throws ValueError for non-positive bucket sizes or timeout, or an unknown backend.
StrategySpec ddp_strategy(DDPOptions options = DDPOptions());

/// ValueError naming `setting` (e.g. "FSDPOptions: process_group_backend", LT_PROCESS_GROUP_BACKEND)
/// and the choices unless backend is unset, "gloo", "nccl" or "shm".
void check_process_group_backend(const std::string& setting, const std::optional<std::string>& backend);

class DDPStrategy : public Strategy {
 public:
  DDPStrategy(StrategyContext context, DDPOptions options = DDPOptions());
  ~DDPStrategy() override;
  std::string name() const override { return options_.name; }
  const DDPOptions& options() const { return options_; }
  torch::Device root_device() const override;
  int world_size() const override;
  int global_rank() const override;

  void launch_processes() override;
  void setup_environment() override;
  void setup_module(const std::shared_ptr<torch::nn::Module>& module) override;
  void backward(at::Tensor& loss, torch::nn::Module* module) override;
  ScopeGuard no_backward_sync(const torch::nn::Module& module, bool enabled) override;

  void barrier(const std::string& name = {}) override;
  at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  at::Tensor all_gather(const at::Tensor& tensor) override;
  at::Tensor broadcast(const at::Tensor& tensor, int src) override;
  std::string broadcast_bytes(const std::string& bytes, int src) override;

  /// The process group (after setup_environment).
  Collective& collective();

 protected:
  int num_processes() const { return static_cast<int>(context_.parallel_devices.size()); }

  DDPOptions options_;
  std::unique_ptr<SubprocessLauncher> launcher_;
  std::shared_ptr<Collective> collective_;
  std::vector<std::unique_ptr<internal::GradientReducer>> reducers_;  // one per set-up module
  std::set<const torch::nn::Module*> sync_disabled_;
};

}  // namespace lightning::fabric
