// lf::SyncBatchNorm inside a ddp job (2 or 4 ranks under lightning-run) against one process's
// torch::nn::BatchNorm over the concatenated batch, rank r holding 2 + r samples: outputs, input
// gradients, parameter gradients (after ddp's averaging) and running statistics within 1e-5 on
// every rank, for [N, C] and [N, C, L] (1-D), 2-D and 3-D inputs, over two training steps and an
// evaluation forward. Each rank prints "FAIL: ..." per failed check and exits 1 if any failed.
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

void expect_close(const torch::Tensor& ours, const torch::Tensor& reference, const std::string& what) {
  const double error = relative_error(ours, reference);
  expect(error <= 1e-5, what + " differs from one process's BatchNorm by " + std::to_string(error));
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
}  // namespace

int main() {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy("ddp"));
  lf::Fabric::seed_everything(17);  // the same data on every rank; each keeps its own rows
  check_shape(fabric, torch::nn::BatchNorm1d(3), {}, "[N, C]");
  check_shape(fabric, torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(3).momentum(0.3)), {5}, "[N, C, L]");
  check_shape(fabric, torch::nn::BatchNorm2d(4), {3, 2}, "[N, C, H, W]");
  check_shape(fabric, torch::nn::BatchNorm3d(torch::nn::BatchNormOptions(2).momentum(std::nullopt)), {2, 2, 3},
              "[N, C, D, H, W] (cumulative average)");
  if (checks::failures() > 0) return 1;
  std::cout << "rank " << fabric.global_rank() << ": SyncBatchNorm equals one process's BatchNorm" << std::endl;
  return 0;
}
