// Distributed data parallel: one process per device, parameters broadcast from rank 0 at setup,
// buffers (BatchNorm statistics) from rank 0 before each forward as PyTorch's DDP does,
// gradients averaged over all ranks during fabric.backward: bucketed all-reduces start as soon as
// a bucket's gradients are ready, overlapping with the rest of backward
// (lib/private/lightning/fabric/internal/gradient_reducer.h). The process group, ranks and launching come from
// ParallelStrategy (parallel.h).
#pragma once

#include "lightning/fabric/export.h"

#include <chrono>
#include <memory>
#include <optional>
#include <set>
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
  /// As PyTorch's DistributedDataParallel(broadcast_buffers=True): before a set-up module's
  /// forward, rank 0's buffers (BatchNorm running statistics and counts) are sent to every rank,
  /// coalesced into flat tensors of at most 250 MiB, so that every rank normalises with, and
  /// saves, the same statistics. Like PyTorch, a forward skips it when the one before ran under
  /// no_grad or no_backward_sync. Off: each rank keeps its own buffers after setup.
  bool broadcast_buffers = true;
  /// Timeouts, backend and hang detection of the process group (process_group_settings.h).
  ProcessGroupSettings process_group;
  /// Submodules whose activations are recomputed in backward (activation_checkpoint.h), e.g.
  /// lf::ModulePolicy::of_type<BlockImpl>(); empty: none. SetupOptions::activation_checkpointing wins.
  ModulePolicy activation_checkpointing;
};

/// DDP with settings, for FabricOptions().strategy(...):
///   lf::DDPOptions ddp;
///   ddp.process_group.timeout = std::chrono::minutes(5);
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
  ModulePolicy activation_checkpointing() const override { return options_.activation_checkpointing; }

  /// Broadcasts rank 0's parameters and buffers, then attaches a gradient reducer (collective).
  /// Both run over data_group(): every rank, or a composed strategy's data group (parallel.h).
  void setup_module(const std::shared_ptr<torch::nn::Module>& module) override;
  void backward(at::Tensor& loss, torch::nn::Module* module, const BackwardOptions& options) override;
  /// broadcast_buffers: rank 0's buffers to every rank of the data-parallel group.
  void before_forward(const torch::nn::Module& module) override;

 private:
  DDPOptions options_;
  std::vector<std::unique_ptr<internal::GradientReducer>> reducers_;  // one per set-up module
  /// Modules whose next forward skips the buffer broadcast (the one before ran under no_grad or
  /// no_backward_sync), as PyTorch's require_forward_param_sync.
  std::set<const torch::nn::Module*> skip_next_buffer_broadcast_;
};

}  // namespace lightning::fabric
