// Batch normalisation over the global batch of a data-parallel job (PyTorch's SyncBatchNorm),
// which LibTorch lacks. In training, every rank's statistics are summed over the strategy's
// data-parallel group, so each rank normalises with the mean and variance of all ranks' samples
// together (uneven batch sizes per rank included), and the backward sums the two per-channel
// reductions it needs over the group: outputs, input gradients and running statistics equal a
// single process's BatchNorm over the concatenated batch. In evaluation, or with no group (one
// process, before fabric.setup), it is BatchNorm: the running statistics.
//
//   struct NetImpl : torch::nn::Module {
//     lf::SyncBatchNorm norm{register_module("norm", lf::SyncBatchNorm(64))};  // any [N, C, ...]
//   };
//   norm = lf::SyncBatchNorm(existing_batch_norm_2d);  // or from a BatchNorm1d/2d/3d, weights and statistics kept
//
// fabric.setup binds the group: ddp's world, model_parallel's data group, or the subgroup given
// with set_process_group (Python's process_group=; from fabric.new_group). Its parameters and
// buffers have BatchNorm's names, so checkpoints move between the two. Collective: every rank of
// the group runs each training forward and backward through it in the same order.
//
// convert_sync_batchnorm (Python's) converts what LibTorch lets it re-point: a BatchNorm root, and
// the BatchNorm layers of every torch::nn::Sequential (or subclass) in the tree, in place. A
// BatchNorm that a parent holds in a typed member (torch::nn::BatchNorm2d bn) cannot be re-pointed
// from outside: it refuses naming each one; declare those as lf::SyncBatchNorm.
#pragma once

#include "lightning/fabric/export.h"

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <optional>

#include "lightning/fabric/process_group.h"

namespace lightning::fabric {

class Collective;  // the process group (private to the library)

struct LF_API SyncBatchNormOptions {
  /* implicit */ SyncBatchNormOptions(int64_t num_features) : num_features(num_features) {}
  int64_t num_features;
  double eps = 1e-5;
  /// Unset: a cumulative average of every batch's statistics (BatchNorm's momentum=None).
  std::optional<double> momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
};

class LF_API SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(SyncBatchNormOptions options);
  /// The options, weights and statistics of a LibTorch BatchNorm (copied).
  explicit SyncBatchNormImpl(const torch::nn::BatchNorm1dImpl& norm);
  explicit SyncBatchNormImpl(const torch::nn::BatchNorm2dImpl& norm);
  explicit SyncBatchNormImpl(const torch::nn::BatchNorm3dImpl& norm);

  void reset() override;
  void reset_running_stats();
  /// input [N, C, ...] with C = num_features (ValueError otherwise).
  at::Tensor forward(const at::Tensor& input);

  /// The group the statistics are summed over; fabric.setup sets it. Null: this process alone.
  void set_group(std::shared_ptr<Collective> group) { group_ = std::move(group); }
  const std::shared_ptr<Collective>& group() const { return group_; }
  /// Sum the statistics over these ranks instead of the strategy's data-parallel group (set before
  /// fabric.setup; every rank that runs this layer must be a member). Null: the strategy's group.
  void set_process_group(std::shared_ptr<ProcessGroup> group) { process_group_ = std::move(group); }
  const std::shared_ptr<ProcessGroup>& process_group() const { return process_group_; }
  /// What fabric.setup calls: binds process_group() when set (ValueError for a non-member), else
  /// the strategy's group.
  void bind(const std::shared_ptr<Collective>& strategy_group, int global_rank);

  SyncBatchNormOptions options;
  at::Tensor weight, bias;                                   // [C] when affine
  at::Tensor running_mean, running_var, num_batches_tracked;  // when track_running_stats

 private:
  template <class Norm>
  void copy_from(const Norm& norm);
  std::shared_ptr<Collective> group_;
  std::shared_ptr<ProcessGroup> process_group_;
};
TORCH_MODULE(SyncBatchNorm);

/// Python's SyncBatchNorm.convert_sync_batchnorm: every BatchNorm1d/2d/3d of module replaced, in
/// place, by an lf::SyncBatchNorm (options, weights, statistics and training mode kept; group: its
/// process group, null for the strategy's). Returns module, or the new layer when module itself is
/// a BatchNorm. ValueError naming every BatchNorm it cannot re-point (held by a parent other than a
/// torch::nn::Sequential or a subclass of one) and the fix; then nothing is changed.
LF_API std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(const std::shared_ptr<torch::nn::Module>& module,
                                                                 std::shared_ptr<ProcessGroup> group = nullptr);

}  // namespace lightning::fabric
