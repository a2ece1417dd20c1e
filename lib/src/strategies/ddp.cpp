#include "lightning/fabric/strategies/ddp.h"

#include <algorithm>

#include <torch/csrc/autograd/grad_mode.h>

#include "lightning/fabric/internal/gradient_reducer.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/sync_batch_norm.h"

namespace lightning::fabric {

namespace {
constexpr size_t kBufferBroadcastBucketBytes = size_t{250} << 20;  // PyTorch DDP's broadcast_bucket_size
}  // namespace

DDPStrategy::DDPStrategy(StrategyContext context, DDPOptions options)
    : ParallelStrategy(std::move(context), options.process_group), options_(std::move(options)) {}

DDPStrategy::~DDPStrategy() = default;

StrategySpec ddp_strategy(DDPOptions options) {
  LF_CHECK(options.bucket_cap_mb > 0 && options.first_bucket_mb > 0, ValueError, "DDPOptions: bucket_cap_mb=",
           options.bucket_cap_mb, " and first_bucket_mb=", options.first_bucket_mb,
           " must be positive (defaults 25 and 1 MiB).");
  check_process_group_settings("DDPOptions", options.process_group);
  return StrategySpec{options.name, [options](StrategyContext context) -> std::shared_ptr<Strategy> {
                        return std::make_shared<DDPStrategy>(std::move(context), options);
                      }};
}

void DDPStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  setup_environment();
  const std::shared_ptr<Collective> group = shared_data_group();
  broadcast_module_from_rank_zero(*module, {}, group.get());
  skip_next_buffer_broadcast_.erase(module.get());  // a module freed before may have had this address
  for (const auto& child : module->modules()) {  // SyncBatchNorm: its statistics over the data-parallel group
    if (auto* norm = dynamic_cast<SyncBatchNormImpl*>(child.get())) norm->bind(group, global_rank());
  }
  reducers_.push_back(std::make_unique<internal::GradientReducer>(module, group, options_.first_bucket_mb,
                                                                   options_.bucket_cap_mb));
}

void DDPStrategy::before_forward(const torch::nn::Module& module) {
  if (!options_.broadcast_buffers || world_size() < 2) return;
  const std::shared_ptr<Collective> group = shared_data_group();
  const bool skip = skip_next_buffer_broadcast_.erase(&module) > 0;
  if (!torch::GradMode::is_enabled() || !syncs_gradients_of(&module)) skip_next_buffer_broadcast_.insert(&module);
  if (skip || group->world_size() < 2) return;
  std::vector<at::Tensor> buffers;
  // Written through .data(), which has a version counter of its own: autograd does not see the
  // broadcast as an in-place change, so a second forward before the backward (a GAN's
  // discriminator on real, then generated images) keeps the first forward's backward valid;
  // PyTorch's DDP raises "modified by an inplace operation" there. A training-mode BatchNorm's
  // backward reads the batch statistics it saved, never the running ones.
  for (const auto& buffer : module.buffers()) buffers.push_back(buffer.data());
  if (buffers.empty()) return;
  torch::NoGradGuard no_grad;
  group->broadcast_many_(buffers, 0, kBufferBroadcastBucketBytes);
}

void DDPStrategy::backward(at::Tensor& loss, torch::nn::Module* module, const BackwardOptions& options) {
  reducers_.erase(std::remove_if(reducers_.begin(), reducers_.end(), [](const auto& r) { return r->expired(); }),
                  reducers_.end());
  const std::shared_ptr<Collective> group = world_size() > 1 ? shared_data_group() : nullptr;
  if (group != nullptr && group->world_size() > 1) {
    LF_CHECK(!options.create_graph, ValueError, "fabric.backward(loss, BackwardOptions().higher_order()): strategy=\"",
             name(), "\" averages the gradients of ", group->world_size(), " ranks in place as they arrive, which a graph "
             "of the backward cannot follow (PyTorch's DDP does not support it either). For a gradient penalty or a "
             "meta-learning inner step, take the gradient with fabric.grad(outputs, inputs, "
             "GradOptions().higher_order()), build the penalty from it, and call fabric.backward on the loss that "
             "includes it (docs/user-guide.md, \"Gradient penalties and double backward\").");
    for (auto& reducer : reducers_) {
      if (syncs_gradients_of(reducer->module())) reducer->arm(options.inputs);
    }
  }
  // Disarm even if backward throws, so that a later plain autograd call does not communicate.
  ScopeGuard disarm([this] {
    for (auto& reducer : reducers_) reducer->disarm();
  });
  Strategy::backward(loss, module, options);
}

}  // namespace lightning::fabric
