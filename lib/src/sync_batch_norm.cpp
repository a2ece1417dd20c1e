#include "lightning/fabric/sync_batch_norm.h"

#include <torch/autograd.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/init.h>

#include <numeric>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/registry.h"

namespace lightning::fabric {

namespace {

// Every dimension of an [N, C, ...] tensor but C.
std::vector<int64_t> all_but_channels(const at::Tensor& input) {
  std::vector<int64_t> dims(static_cast<size_t>(input.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  dims.erase(dims.begin() + 1);
  return dims;
}

// [C] -> [1, C, 1, ...] to broadcast against an [N, C, ...] input.
at::Tensor per_channel(const at::Tensor& values, const at::Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = values.size(0);
  return values.view(shape);
}

// Training-mode batch norm over the group's global batch. Sums run in float64 whatever the input's
// dtype, then the mean and 1/std are cast back. Saved for backward: the input, the weight, the
// global mean, 1/std and count. The group is the module's, alive while it is.
struct SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var,
                            double eps, double factor, int64_t group_address) {
    auto* group = reinterpret_cast<Collective*>(group_address);
    const auto dims = all_but_channels(input);
    const int64_t channels = input.size(1);
    const at::Tensor wide = input.to(at::kDouble);
    // [sum, sum of squares, count] of this rank, summed over the group.
    at::Tensor stats = at::cat({wide.sum(dims), wide.pow(2).sum(dims),
                                at::full({1}, static_cast<double>(input.numel() / std::max<int64_t>(channels, 1)),
                                         wide.options())});
    group->all_reduce_(stats, ReduceOp::Sum);
    const double count = stats[2 * channels].item<double>();
    LF_CHECK(count > 1, ValueError, "SyncBatchNorm: expected more than 1 value per channel over the group in "
             "training, got ", count, " (the global batch is too small).");
    const at::Tensor mean = stats.narrow(0, 0, channels) / count;
    const at::Tensor variance = (stats.narrow(0, channels, channels) / count - mean * mean).clamp_min(0);
    const at::Tensor invstd = (variance + eps).rsqrt();
    if (running_mean.defined()) {
      torch::NoGradGuard no_grad;
      running_mean.mul_(1 - factor).add_(mean.to(running_mean.scalar_type()), factor);
      running_var.mul_(1 - factor).add_((variance * (count / (count - 1))).to(running_var.scalar_type()), factor);
    }
    const at::Tensor mean_cast = mean.to(input.scalar_type()), invstd_cast = invstd.to(input.scalar_type());
    at::Tensor output = (input - per_channel(mean_cast, input)) * per_channel(invstd_cast, input);
    if (weight.defined()) output = output * per_channel(weight, input) + per_channel(bias, input);
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["group"] = group_address;
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const double count = ctx->saved_data["count"].toDouble();
    auto* group = reinterpret_cast<Collective*>(ctx->saved_data["group"].toInt());
    const at::Tensor& grad = grads[0];
    const auto dims = all_but_channels(input);
    const at::Tensor centered = input.to(at::kDouble) - per_channel(mean, input);
    const at::Tensor grad_wide = grad.to(at::kDouble);
    const at::Tensor sum_dy = grad_wide.sum(dims);
    const at::Tensor sum_dy_xmu = (grad_wide * centered).sum(dims);
    at::Tensor grad_input, grad_weight, grad_bias;
    // This rank's parts: data-parallel training averages parameter gradients afterwards.
    if (weight.defined() && ctx->needs_input_grad(1)) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    if (weight.defined() && ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
    if (ctx->needs_input_grad(0)) {
      const int64_t channels = input.size(1);
      at::Tensor sums = at::cat({sum_dy, sum_dy_xmu});
      group->all_reduce_(sums, ReduceOp::Sum);
      const at::Tensor mean_dy = sums.narrow(0, 0, channels) / count;
      const at::Tensor mean_dy_xmu = sums.narrow(0, channels, channels) / count;
      at::Tensor scale = invstd;
      if (weight.defined()) scale = scale * weight.to(at::kDouble);
      grad_input = ((grad_wide - per_channel(mean_dy, input) - centered * per_channel(invstd * invstd * mean_dy_xmu, input)) *
                    per_channel(scale, input))
                       .to(input.scalar_type());
    }
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_) : options(std::move(options_)) {
  LF_CHECK(options.num_features > 0, ValueError, "SyncBatchNorm: num_features=", options.num_features,
           " must be positive.");
  reset();
}

template <class Norm>
void SyncBatchNormImpl::copy_from(const Norm& norm) {
  torch::NoGradGuard no_grad;
  if (options.affine) {
    weight.copy_(norm.weight);
    bias.copy_(norm.bias);
  }
  if (options.track_running_stats) {
    running_mean.copy_(norm.running_mean);
    running_var.copy_(norm.running_var);
    num_batches_tracked.copy_(norm.num_batches_tracked);
  }
  to(norm.weight.defined() ? norm.weight.device() : norm.running_mean.defined() ? norm.running_mean.device()
                                                                               : torch::Device(torch::kCPU));
  train(norm.is_training());
}

namespace {
template <class Options>
SyncBatchNormOptions options_of(const Options& from) {
  SyncBatchNormOptions options(from.num_features());
  options.eps = from.eps();
  options.momentum = from.momentum();
  options.affine = from.affine();
  options.track_running_stats = from.track_running_stats();
  return options;
}
}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNorm1dImpl& norm) : SyncBatchNormImpl(options_of(norm.options)) {
  copy_from(norm);
}
SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNorm2dImpl& norm) : SyncBatchNormImpl(options_of(norm.options)) {
  copy_from(norm);
}
SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNorm3dImpl& norm) : SyncBatchNormImpl(options_of(norm.options)) {
  copy_from(norm);
}

void SyncBatchNormImpl::reset() {
  if (options.affine) {
    weight = register_parameter("weight", torch::ones({options.num_features}));
    bias = register_parameter("bias", torch::zeros({options.num_features}));
  }
  if (options.track_running_stats) {
    running_mean = register_buffer("running_mean", torch::zeros({options.num_features}));
    running_var = register_buffer("running_var", torch::ones({options.num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
  }
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats) return;
  torch::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  LF_CHECK(input.dim() >= 2 && input.size(1) == options.num_features, ValueError, "SyncBatchNorm: expected an input "
           "[N, ", options.num_features, ", ...] (num_features=", options.num_features, "), got ", input.sizes(), ".");
  double factor = options.momentum.value_or(0.0);
  if (is_training() && options.track_running_stats) {
    torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
    if (!options.momentum) factor = 1.0 / num_batches_tracked.item<double>();
  }
  const bool use_batch_stats = is_training() || !options.track_running_stats;
  const bool tracked = !is_training() || options.track_running_stats;
  const at::Tensor mean_buffer = tracked ? running_mean : at::Tensor();
  const at::Tensor var_buffer = tracked ? running_var : at::Tensor();
  if (!use_batch_stats || !is_training() || group_ == nullptr || group_->world_size() < 2) {
    return torch::nn::functional::detail::batch_norm(input, mean_buffer, var_buffer, weight, bias, use_batch_stats,
                                                     factor, options.eps);
  }
  return SyncBatchNormFunction::apply(input, weight, bias, mean_buffer, var_buffer, options.eps, factor,
                                      reinterpret_cast<int64_t>(group_.get()));
}

void SyncBatchNormImpl::bind(const std::shared_ptr<Collective>& strategy_group, int global_rank) {
  if (process_group_ == nullptr) {
    group_ = strategy_group;
    return;
  }
  Collective* chosen = process_group_->communicator("SyncBatchNorm (set_process_group)", global_rank);
  group_ = chosen == nullptr ? nullptr : std::shared_ptr<Collective>(process_group_, chosen);  // keeps the group alive
}

namespace {
bool is_batch_norm(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module) != nullptr;
}

std::shared_ptr<SyncBatchNormImpl> sync_copy_of(const torch::nn::Module& module, const std::shared_ptr<ProcessGroup>& group) {
  std::shared_ptr<SyncBatchNormImpl> converted;
  if (auto* norm = dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module)) converted = std::make_shared<SyncBatchNormImpl>(*norm);
  if (auto* norm = dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module)) converted = std::make_shared<SyncBatchNormImpl>(*norm);
  if (auto* norm = dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module)) converted = std::make_shared<SyncBatchNormImpl>(*norm);
  converted->train(module.is_training());
  converted->set_process_group(group);
  return converted;
}

// BatchNorms under module (path-prefixed) that no Sequential holds directly.
void collect_unreachable(const torch::nn::Module& module, const std::string& path, std::vector<std::string>& out) {
  const bool sequential = dynamic_cast<const torch::nn::SequentialImpl*>(&module) != nullptr;
  for (const auto& item : module.named_children()) {
    const std::string name = path.empty() ? item.key() : path + "." + item.key();
    if (is_batch_norm(*item.value())) {
      if (!sequential) out.push_back("'" + name + "'");
    } else {
      collect_unreachable(*item.value(), name, out);
    }
  }
}

// Replaces, in place, each BatchNorm that a Sequential (or a subclass of one) anywhere under module
// holds: its entry in the Sequential's list of layers and its registered child alike.
void convert_in_sequentials(torch::nn::Module& module, const std::shared_ptr<ProcessGroup>& group) {
  for (const auto& child : module.modules(/*include_self=*/true)) {
    auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(child.get());
    if (sequential == nullptr) continue;
    const auto names = sequential->named_children();
    for (size_t i = 0; i < sequential->size(); ++i) {
      const auto layer = sequential->ptr(i);
      if (!is_batch_norm(*layer)) continue;
      auto converted = sync_copy_of(*layer, group);
      *(sequential->begin() + static_cast<std::ptrdiff_t>(i)) = torch::nn::AnyModule(converted);
      sequential->replace_module(names[i].key(), converted);
    }
  }
}
}  // namespace

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(const std::shared_ptr<torch::nn::Module>& module,
                                                          std::shared_ptr<ProcessGroup> group) {
  LF_CHECK(module != nullptr, ValueError, "convert_sync_batchnorm: the module is null.");
  if (is_batch_norm(*module)) return sync_copy_of(*module, group);
  std::vector<std::string> unreachable;
  collect_unreachable(*module, "", unreachable);
  LF_CHECK(unreachable.empty(), ValueError, "convert_sync_batchnorm: the BatchNorm layers ", join_names(unreachable),
           " are held by a parent other than a torch::nn::Sequential. A LibTorch parent calls a child through its own "
           "typed member, which no converter can re-point: declare those layers as lf::SyncBatchNorm (or build "
           "lf::SyncBatchNorm(existing_batch_norm)), or hold them in a torch::nn::Sequential.");
  convert_in_sequentials(*module, group);
  return module;
}

}  // namespace lightning::fabric
