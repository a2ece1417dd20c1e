// lf::SyncBatchNorm inside a ddp job (2 or 4 ranks under lightning-run) against one process's
// torch::nn::BatchNorm over the concatenated batch, rank r holding 2 + r samples: outputs, input
// gradients, parameter gradients (after ddp's averaging) and running statistics within 1e-5 on
// every rank, for [N, C] and [N, C, L] (1-D), 2-D and 3-D inputs, over two training steps and an
// evaluation forward; convert_sync_batchnorm on nested Sequentials (and its refusal of a typed
// member); set_process_group over pairs of ranks, forward and backward. With argument bf16-mixed:
// a Linear and a SyncBatchNorm under that precision against one process's float32 model (3e-2).
// Each rank prints "FAIL: ..." per failed check and exits 1 if any failed.
#include <torch/torch.h>

#include <iostream>

#include "expect.h"
#include "lightning/fabric.h"

namespace lf = lightning::fabric;

namespace {
using checks::expect;

double relative_error(const torch::Tensor& ours, const torch::Tensor& reference) {
  return ((ours - reference).abs().max() / reference.abs().max().clamp_min(1e-6)).item<double>();
}

double tolerance = 1e-5;  // bf16-mixed: 3e-2 against one process's float32 BatchNorm

void expect_close(const torch::Tensor& ours, const torch::Tensor& reference, const std::string& what) {
  const double error = relative_error(ours.to(torch::kFloat), reference.to(torch::kFloat));
  expect(error <= tolerance, what + " differs from one process's BatchNorm by " + std::to_string(error));
}

// One input shape per sample ({} for [N, C]); Norm is the LibTorch BatchNorm of that rank.
template <class Norm>
void check_shape(lf::Fabric& fabric, Norm reference, const std::vector<int64_t>& sample, const std::string& name) {
  const int world = fabric.world_size(), rank = fabric.global_rank();
  const int64_t channels = reference->options.num_features();
  int64_t total = 0, offset = 0;
  for (int r = 0; r < world; ++r) {
    if (r == rank) offset = total;
    total += 2 + r;
  }
  const int64_t mine = 2 + rank;
  {
    torch::NoGradGuard no_grad;
    reference->weight.uniform_(0.5, 1.5);
    reference->bias.normal_();
  }
  auto norm = std::make_shared<lf::SyncBatchNormImpl>(*reference);  // the same weights and statistics
  auto model = fabric.setup_module(norm);
  std::vector<int64_t> shape{total, channels};
  shape.insert(shape.end(), sample.begin(), sample.end());
  for (int step = 0; step < 2; ++step) {
    const std::string at = name + " step " + std::to_string(step) + ": ";
    const auto inputs = torch::randn(shape) * 2 + 1;  // the same on every rank (seeded alike)
    const auto output_grads = torch::randn(shape);
    norm->zero_grad();
    reference->zero_grad();
    const auto local = inputs.narrow(0, offset, mine).clone().requires_grad_();
    const auto output = model(local);
    fabric.backward((output * output_grads.narrow(0, offset, mine)).sum());
    const auto whole = inputs.clone().requires_grad_();
    const auto reference_output = reference(whole);
    (reference_output * output_grads).sum().backward();
    expect_close(output, reference_output.narrow(0, offset, mine), at + "the output");
    expect_close(local.grad(), whole.grad().narrow(0, offset, mine), at + "the input gradient");
    // ddp averages the ranks' parameter gradients; the single process's loss is their sum.
    expect_close(norm->weight.grad() * world, reference->weight.grad(), at + "the weight gradient");
    expect_close(norm->bias.grad() * world, reference->bias.grad(), at + "the bias gradient");
    expect_close(norm->running_mean, reference->running_mean, at + "the running mean");
    expect_close(norm->running_var, reference->running_var, at + "the running variance");
    expect(torch::equal(norm->num_batches_tracked, reference->num_batches_tracked),
           at + "the batch count differs");
  }
  norm->eval();
  reference->eval();
  const auto inputs = torch::randn(shape);
  torch::NoGradGuard no_grad;
  expect_close(model(inputs.narrow(0, offset, mine)), reference(inputs).narrow(0, offset, mine),
               name + ": the evaluation output (running statistics)");
}
// A nested Sequential, as LibTorch allows one: a subclass with a forward of its own.
struct BlockImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return SequentialImpl::forward(std::move(x)); }
};
TORCH_MODULE(Block);

// convert_sync_batchnorm on a Sequential holding a nested block, trained under ddp, against the
// plain model in one process over the whole batch (outputs and running statistics); a typed
// member is refused by name; a BatchNorm root comes back as a SyncBatchNorm.
void check_converter(lf::Fabric& fabric) {
  const int world = fabric.world_size(), rank = fabric.global_rank();
  auto build = [] {
    torch::manual_seed(5);
    return torch::nn::Sequential(torch::nn::Linear(6, 4), torch::nn::BatchNorm1d(4), torch::nn::ReLU(),
                                 Block(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3)));
  };
  auto reference = build();
  auto original = build();
  auto converted = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(lf::convert_sync_batchnorm(original.ptr()));
  expect(converted == original.ptr() && converted->named_modules().size() == reference->named_modules().size(),
         "convert_sync_batchnorm converts a Sequential in place and returns it");
  int synced = 0;
  for (const auto& module : converted->modules()) synced += dynamic_cast<lf::SyncBatchNormImpl*>(module.get()) ? 1 : 0;
  expect(synced == 2, "convert_sync_batchnorm replaced both BatchNorms (" + std::to_string(synced) + ")");
  auto model = fabric.setup_module(converted);
  const auto inputs = torch::randn({4 * world, 6});
  const auto mine = inputs.narrow(0, 4 * rank, 4);
  torch::NoGradGuard no_grad;
  const auto ours = model(mine);
  const auto whole = reference->forward(inputs);
  expect_close(ours, whole.narrow(0, 4 * rank, 4), "converted model: the output");
  const auto& ours_bn = *std::dynamic_pointer_cast<lf::SyncBatchNormImpl>(converted->ptr<BlockImpl>(3)->ptr(1));
  const auto& reference_bn = *std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(reference->ptr<BlockImpl>(3)->ptr(1));
  expect_close(ours_bn.running_mean, reference_bn.running_mean, "converted model: the nested layer's running mean");
  expect_close(ours_bn.running_var, reference_bn.running_var, "converted model: the nested layer's running variance");

  struct Typed : torch::nn::Module {
    torch::nn::BatchNorm2d bn{register_module("bn", torch::nn::BatchNorm2d(3))};
  };
  std::string message;
  try {
    lf::convert_sync_batchnorm(std::make_shared<Typed>());
  } catch (const lf::ValueError& error) {
    message = error.what();
  }
  expect(message.find("'bn'") != std::string::npos && message.find("declare those layers as lf::SyncBatchNorm") != std::string::npos,
         "convert_sync_batchnorm refuses a typed member by name, got: " + message);
  auto root = lf::convert_sync_batchnorm(torch::nn::BatchNorm2d(3).ptr());
  expect(std::dynamic_pointer_cast<lf::SyncBatchNormImpl>(root) != nullptr, "a BatchNorm root becomes a SyncBatchNorm");
}

// set_process_group: ranks in pairs ({0, 1}, {2, 3}; alone on 2 ranks) normalise over their
// pair's rows only, against one process's BatchNorm over those rows: the output, the running mean,
// the input gradient (the backward's sums over the pair only) and the parameter gradients (ddp
// averages them over every rank: times the world size, they are the pairs' sum).
void check_subgroup(lf::Fabric& fabric) {
  const int world = fabric.world_size(), rank = fabric.global_rank();
  const int pair_size = world >= 4 ? 2 : 1;
  std::shared_ptr<lf::ProcessGroup> mine;
  for (int first = 0; first < world; first += pair_size) {
    std::vector<int> ranks;
    for (int r = first; r < first + pair_size; ++r) ranks.push_back(r);
    auto group = fabric.new_group(ranks);  // every rank makes every pair, in the same order
    if (group->is_member()) mine = group;
  }
  torch::manual_seed(9);
  torch::nn::BatchNorm1d reference(3);
  auto norm = std::make_shared<lf::SyncBatchNormImpl>(*reference);
  norm->set_process_group(mine);
  auto model = fabric.setup_module(norm);
  const auto inputs = torch::randn({2 * world, 3}) * 3 + 1;
  const auto output_grads = torch::randn({2 * world, 3});
  const int first = mine->ranks().front();
  const auto local = inputs.narrow(0, 2 * rank, 2).clone().requires_grad_();
  const auto output = model(local);
  fabric.backward((output * output_grads.narrow(0, 2 * rank, 2)).sum());
  const auto pair_inputs = inputs.narrow(0, 2 * first, 2 * pair_size).clone().requires_grad_();
  const auto pair_output = reference(pair_inputs);
  (pair_output * output_grads.narrow(0, 2 * first, 2 * pair_size)).sum().backward();
  expect_close(output, pair_output.narrow(0, 2 * (rank - first), 2), "set_process_group: the output over the pair's rows");
  expect_close(norm->running_mean, reference->running_mean, "set_process_group: the running mean over the pair's rows");
  expect_close(local.grad(), pair_inputs.grad().narrow(0, 2 * (rank - first), 2),
               "set_process_group: the input gradient over the pair's rows");
  // Every pair's reference, for the parameter gradients ddp averaged over all ranks.
  torch::Tensor weight_sum = torch::zeros({3}), bias_sum = torch::zeros({3});
  for (int pair = 0; pair < world; pair += pair_size) {
    torch::manual_seed(9);
    torch::nn::BatchNorm1d each(3);
    const auto rows = inputs.narrow(0, 2 * pair, 2 * pair_size);
    (each(rows) * output_grads.narrow(0, 2 * pair, 2 * pair_size)).sum().backward();
    weight_sum += each->weight.grad();
    bias_sum += each->bias.grad();
  }
  expect_close(norm->weight.grad() * world, weight_sum, "set_process_group: the weight gradient (the pairs' sum)");
  expect_close(norm->bias.grad() * world, bias_sum, "set_process_group: the bias gradient (the pairs' sum)");
}

// bf16-mixed on every rank: a Linear (autocast to bf16) feeding a SyncBatchNorm, two training
// steps, against one process's float32 model over the whole batch within 3e-2 (relative).
void check_bf16_mixed(lf::Fabric& fabric) {
  const int world = fabric.world_size(), rank = fabric.global_rank();
  const auto build = [] {
    torch::manual_seed(21);
    // No bias before the norm: its exact gradient is zero (the norm takes the mean out), which a
    // relative comparison cannot take.
    return torch::nn::Sequential(torch::nn::Linear(torch::nn::LinearOptions(6, 4).bias(false)), torch::nn::BatchNorm1d(4));
  };
  auto reference = build();
  auto converted = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(lf::convert_sync_batchnorm(build().ptr()));
  auto model = fabric.setup_module(converted);
  for (int step = 0; step < 2; ++step) {
    const std::string at = "bf16-mixed step " + std::to_string(step) + ": ";
    const auto inputs = torch::randn({4 * world, 6}) * 2 + 1;
    const auto output_grads = torch::randn({4 * world, 4});
    converted->zero_grad();
    reference->zero_grad();
    const auto output = model(inputs.narrow(0, 4 * rank, 4));
    expect(output.scalar_type() == torch::kFloat || output.scalar_type() == torch::kBFloat16,
           at + "the output's dtype is neither float32 nor bf16");
    fabric.backward((output.to(torch::kFloat) * output_grads.narrow(0, 4 * rank, 4)).sum());
    const auto whole = reference->forward(inputs);
    (whole * output_grads).sum().backward();
    expect_close(output, whole.narrow(0, 4 * rank, 4), at + "the output");
    const auto ours = converted->parameters(), theirs = reference->parameters();
    for (size_t i = 0; i < ours.size(); ++i) {
      expect_close(ours[i].grad() * world, theirs[i].grad(), at + "the gradient of parameter " + std::to_string(i));
    }
    const auto& ours_bn = *std::dynamic_pointer_cast<lf::SyncBatchNormImpl>(converted->ptr(1));
    const auto& reference_bn = *std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(reference->ptr(1));
    expect_close(ours_bn.running_mean, reference_bn.running_mean, at + "the running mean");
    expect_close(ours_bn.running_var, reference_bn.running_var, at + "the running variance");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string precision = argc > 1 ? argv[1] : "32-true";
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy("ddp").precision(precision));
  lf::Fabric::seed_everything(17);  // the same data on every rank; each keeps its own rows
  if (precision == "bf16-mixed") {
    tolerance = 3e-2;
    check_bf16_mixed(fabric);
    if (checks::failures() > 0) return 1;
    std::cout << "rank " << fabric.global_rank() << ": SyncBatchNorm under bf16-mixed equals one process's float32 "
              << "BatchNorm" << std::endl;
    return 0;
  }
  check_shape(fabric, torch::nn::BatchNorm1d(3), {}, "[N, C]");
  check_shape(fabric, torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(3).momentum(0.3)), {5}, "[N, C, L]");
  check_shape(fabric, torch::nn::BatchNorm2d(4), {3, 2}, "[N, C, H, W]");
  check_shape(fabric, torch::nn::BatchNorm3d(torch::nn::BatchNormOptions(2).momentum(std::nullopt)), {2, 2, 3},
              "[N, C, D, H, W] (cumulative average)");
  check_converter(fabric);
  check_subgroup(fabric);
  if (checks::failures() > 0) return 1;
  std::cout << "rank " << fabric.global_rank() << ": SyncBatchNorm equals one process's BatchNorm" << std::endl;
  return 0;
}
