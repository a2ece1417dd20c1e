#include "lightning/fabric/tensor_parallel/cross_entropy.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/device_mesh.h"

namespace lightning::fabric::tensor_parallel {
namespace {

struct GroupHandle : torch::CustomClassHolder {
  Collective* group = nullptr;
};

// Per-row losses of [rows, V/T] logits against [rows] targets. Saves softmax - one_hot.
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<GroupHandle> handle,
                            int64_t vocab_start, const at::Tensor& logits, const at::Tensor& targets) {
    Collective& group = *handle->group;
    // In float32 at least: half-precision logits are reduced in float32, float64 stays.
    const at::Tensor work = (logits.scalar_type() == at::kDouble ? logits : logits.to(at::kFloat)).contiguous();
    at::Tensor max = std::get<0>(work.max(-1));
    group.all_reduce_(max, ReduceOp::Max);
    const at::Tensor shifted = work - max.unsqueeze(-1);
    const int64_t columns = work.size(-1);
    const at::Tensor outside = (targets < vocab_start).logical_or(targets >= vocab_start + columns);
    const at::Tensor local_targets = (targets - vocab_start).masked_fill(outside, 0);
    at::Tensor target_logit = shifted.gather(-1, local_targets.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0);
    group.all_reduce_(target_logit, ReduceOp::Sum);
    const at::Tensor exponentials = shifted.exp();
    at::Tensor sum = exponentials.sum(-1);
    group.all_reduce_(sum, ReduceOp::Sum);
    at::Tensor gradient = exponentials / sum.unsqueeze(-1);
    const at::Tensor hit = outside.logical_not().to(gradient.scalar_type()).unsqueeze(-1);
    gradient.scatter_add_(-1, local_targets.unsqueeze(-1), -hit);
    ctx->save_for_backward({gradient});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return (sum.log() - target_logit).to(logits.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor gradient = ctx->get_saved_variables()[0];
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {at::Tensor(), at::Tensor(), (gradient * grads[0].unsqueeze(-1).to(gradient.scalar_type())).to(dtype),
            at::Tensor()};
  }
};
}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets, const DeviceMesh& mesh,
                                        const std::string& reduction) {
  LF_CHECK(reduction == "mean" || reduction == "sum" || reduction == "none", ValueError,
           "vocab_parallel_cross_entropy: reduction=\"", reduction, "\" is not supported. Choose \"mean\" (the "
           "default), \"sum\" or \"none\".");
  LF_CHECK(at::isFloatingType(local_logits.scalar_type()) && local_logits.dim() >= 1, ValueError,
           "vocab_parallel_cross_entropy: the logits must be floating with a vocabulary dimension last, got ",
           local_logits.scalar_type(), local_logits.sizes(), ".");
  LF_CHECK(!at::isFloatingType(targets.scalar_type()) &&
               targets.sizes() == local_logits.sizes().slice(0, local_logits.dim() - 1),
           ValueError, "vocab_parallel_cross_entropy: the targets must be integer ids shaped like the logits without "
           "their last dimension (", local_logits.sizes().slice(0, local_logits.dim() - 1), "), got ",
           targets.scalar_type(), targets.sizes(), ".");
  const int64_t columns = local_logits.size(-1), vocab = columns * mesh.size("tensor");
  if (targets.numel() > 0) {
    const bool in_range = targets.min().item<int64_t>() >= 0 && targets.max().item<int64_t>() < vocab;
    LF_CHECK(in_range, ValueError, "vocab_parallel_cross_entropy: a target is outside [0, ", vocab, ") (the "
             "vocabulary: ", columns, " columns on each of ", mesh.size("tensor"), " ranks).");
  }
  auto handle = c10::make_intrusive<GroupHandle>();
  handle->group = &mesh.group("tensor");
  const at::Tensor rows = local_logits.reshape({-1, columns});
  const at::Tensor losses = VocabParallelCrossEntropy::apply(handle, columns * mesh.coordinate("tensor"), rows,
                                                             targets.reshape({-1}).to(at::kLong))
                                .view(targets.sizes());
  if (reduction == "none") return losses;
  return reduction == "sum" ? losses.sum() : losses.mean();
}

}  // namespace lightning::fabric::tensor_parallel
