// Distributed data parallel: one process per device, parameters broadcast from rank 0 at setup,
// gradients averaged over all ranks during fabric.backward: bucketed all-reduces start as soon as
// a bucket's gradients are ready, overlapping with the rest of backward
// (lib/src/internal/gradient_reducer.h). The process group, ranks and launching come from
// ParallelStrategy (parallel.h).
#pragma once

#include "lightning/fabric/export.h"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric/options.h"
#include "lightning/fabric/strategies/parallel.h"

namespace lightning::fabric {

namespace internal {
class GradientReducer;
}

struct LF_API DDPOptions {
  /// The name the strategy reports (strategy()->name(), logs); the registry's aliases such as
  /// "ddp_spawn" set it, and a configured strategy may carry its own.
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
LF_API StrategySpec ddp_strategy(DDPOptions options = DDPOptions());

class LF_API DDPStrategy : public ParallelStrategy {
 public:
  DDPStrategy(StrategyContext context, DDPOptions options = DDPOptions());
  ~DDPStrategy() override;
  std::string name() const override { return options_.name; }
  const DDPOptions& options() const { return options_; }

  /// Broadcasts rank 0's parameters and buffers, then attaches a gradient reducer (collective).
  void setup_module(const std::shared_ptr<torch::nn::Module>& module) override;
  void backward(at::Tensor& loss, torch::nn::Module* module) override;

 private:
  DDPOptions options_;
  std::vector<std::unique_ptr<internal::GradientReducer>> reducers_;  // one per set-up module
};

}  // namespace lightning::fabric
