// The optimizer-step baseline of issue #25: one AdamW step over the parameter shapes of
// examples/gpt (98 M parameters in 149 tensors), on the CPU, in this process:
//   - LibTorch's torch::optim::AdamW::step (FabricOptimizer::step with fusing turned off),
//   - Fabric's fused step, lf::fused_step on a torch::optim::AdamW (FabricOptimizer::step's default),
//   - ATen's fused kernel at::_fused_adamw_ called directly on the same shapes (the floor),
// alternated, median of --steps after --warmup. Prints one JSON line; scripts/bench-optimizer.sh runs
// it beside Python's torch.optim.AdamW(fused=True) and (foreach=False).
//   OMP_NUM_THREADS=1 build/bin/bench_optimizer_step --steps 5 --warmup 2
#include <CLI/CLI.hpp>
#include <lightning/fabric/utilities/fused_step.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

namespace {
// The parameter shapes of examples/gpt's default model, in its registration order.
std::vector<std::vector<int64_t>> gpt_shapes(int64_t vocab, int64_t seq, int64_t d, int64_t layers) {
  std::vector<std::vector<int64_t>> shapes{{vocab, d}, {seq, d}};
  for (int64_t i = 0; i < layers; ++i) {
    for (const auto& shape : std::vector<std::vector<int64_t>>{
             {d}, {d}, {3 * d, d}, {3 * d}, {d, d}, {d}, {d}, {d}, {4 * d, d}, {4 * d}, {d, 4 * d}, {d}}) {
      shapes.push_back(shape);
    }
  }
  shapes.push_back({d});
  shapes.push_back({d});
  shapes.push_back({vocab, d});
  return shapes;
}

std::vector<torch::Tensor> parameters_of(const std::vector<std::vector<int64_t>>& shapes) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> parameters;
  for (const auto& shape : shapes) {
    auto parameter = torch::randn(shape).requires_grad_();
    parameter.mutable_grad() = torch::randn(shape) * 1e-2;
    parameters.push_back(parameter);
  }
  return parameters;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

int main(int argc, char** argv) {
  int steps = 5, warmup = 2;
  CLI::App app{"AdamW step over examples/gpt's parameter shapes: LibTorch's step against ATen's fused kernel"};
  app.add_option("--steps", steps, "Timed steps");
  app.add_option("--warmup", warmup, "Untimed steps first");
  CLI11_PARSE(app, argc, argv);
  const auto shapes = gpt_shapes(8192, 512, 768, 12);
  auto libtorch_parameters = parameters_of(shapes);
  auto fused_parameters = parameters_of(shapes);
  auto fabric_parameters = parameters_of(shapes);
  torch::optim::AdamW libtorch(libtorch_parameters, torch::optim::AdamWOptions(3e-4));
  torch::optim::AdamW fabric(fabric_parameters, torch::optim::AdamWOptions(3e-4));
  std::vector<torch::Tensor> grads, exp_avgs, exp_avg_sqs, steps_done;
  for (const auto& parameter : fused_parameters) {
    grads.push_back(parameter.grad());
    exp_avgs.push_back(torch::zeros_like(parameter));
    exp_avg_sqs.push_back(torch::zeros_like(parameter));
    steps_done.push_back(torch::zeros({}, torch::kFloat32));
  }
  std::vector<torch::Tensor> fused_weights;
  for (const auto& parameter : fused_parameters) fused_weights.push_back(parameter.detach());
  std::vector<double> libtorch_ms, fused_ms, fabric_ms;
  int64_t elements = 0;
  for (const auto& parameter : libtorch_parameters) elements += parameter.numel();
  for (int step = 0; step < warmup + steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    libtorch.step();
    const double one = milliseconds_since(start);
    start = std::chrono::steady_clock::now();
    torch::NoGradGuard no_grad;
    at::_foreach_add_(steps_done, 1);
    at::_fused_adamw_(fused_weights, grads, exp_avgs, exp_avg_sqs, {}, steps_done, 3e-4, 0.9, 0.999, 1e-2, 1e-8,
                      /*amsgrad=*/false, /*maximize=*/false);
    const double other = milliseconds_since(start);
    start = std::chrono::steady_clock::now();
    lightning::fabric::fused_step(fabric);
    const double ours = milliseconds_since(start);
    if (step >= warmup) {
      libtorch_ms.push_back(one);
      fused_ms.push_back(other);
      fabric_ms.push_back(ours);
    }
  }
  double worst = 0, fabric_worst = 0;
  for (size_t i = 0; i < libtorch_parameters.size(); ++i) {
    worst = std::max(worst, (libtorch_parameters[i] - fused_parameters[i]).abs().max().item<double>());
    fabric_worst = std::max(fabric_worst, (libtorch_parameters[i] - fabric_parameters[i]).abs().max().item<double>());
  }
  std::cout << "{\"benchmark\":\"optimizer step\",\"implementation\":\"lightning-fabric-cpp\",\"tensors\":"
            << shapes.size() << ",\"parameters\":" << elements << ",\"threads\":" << at::get_num_threads()
            << ",\"libtorch_adamw_ms\":" << median(libtorch_ms) << ",\"fabric_fused_adamw_ms\":" << median(fabric_ms)
            << ",\"aten_fused_adamw_ms\":" << median(fused_ms)
            << ",\"fabric_fused_over_libtorch\":" << median(fabric_ms) / median(libtorch_ms)
            << ",\"max_abs_difference_after_steps\":" << worst << ",\"fabric_max_abs_difference\":" << fabric_worst
            << "}" << std::endl;
  return 0;
}
