// GPU checks (label "gpu"): 16-mixed and bf16-mixed on CUDA, and the loss scaler on CUDA against
// the same scaler on CPU. main() lives in test_cuda_single_device.cpp.
#include <cmath>
#include <torch/torch.h>

#include "lightning/fabric.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;

namespace {
struct ProbeImpl : torch::nn::Module {
  ProbeImpl() : fc(register_module("fc", torch::nn::Linear(8, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto hidden = fc(x);
    activation = hidden.scalar_type();
    return hidden;
  }
  torch::nn::Linear fc;
  c10::ScalarType activation = torch::kInt;
};
TORCH_MODULE(Probe);

// Runs steps of the scaler on one parameter with the given gradients; returns (scale, tracker, weight).
std::tuple<double, int64_t, torch::Tensor> drive_scaler(torch::Device device, const std::vector<float>& first_grads) {
  lf::LossScalerOptions options;
  options.init_scale = 16.0;
  options.growth_interval = 2;
  lf::LossScaler scaler(options);
  auto weight = torch::ones({1}, torch::TensorOptions().device(device).requires_grad(true));
  torch::optim::SGD sgd(std::vector<torch::Tensor>{weight}, 0.1);
  for (float grad : first_grads) {
    (void)scaler.scale(torch::ones({}, device));  // puts the scale on the device
    weight.mutable_grad() = torch::full({1}, grad * 16.0f, device);
    scaler.step(sgd);
    scaler.update();
  }
  return {scaler.get_scale(), scaler.growth_tracker(), weight.detach().cpu()};
}
}  // namespace

TEST_CASE("cuda: 16-mixed runs the forward in float16 and scales the loss", "[gpu]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cuda").precision("16-mixed"), lf::env::map_env({}));
  REQUIRE(fabric.precision()->loss_scaler() != nullptr);
  Probe probe;
  torch::optim::SGD sgd(probe->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(probe, sgd);
  auto out = model(torch::randn({4, 8}));
  CHECK(probe->activation == torch::kFloat16);
  CHECK(out.scalar_type() == torch::kFloat32);
  // mean, not sum: d(sum)/d(out) = 65536 would overflow float16 (max 65504), and the step would be
  // skipped, as under Python's GradScaler. Each of the 16 outputs gets 65536 / 16; the bias sums 4 rows.
  fabric.backward(out.mean());
  CHECK(probe->fc->bias.grad()[0].item<float>() == Approx(4.0 * 65536.0 / 16.0));
  CHECK(optimizer.step());
  CHECK(fabric.precision()->loss_scaler()->growth_tracker() == 1);
}

TEST_CASE("cuda: bf16-mixed runs the forward in bfloat16", "[gpu]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cuda").precision("bf16-mixed"), lf::env::map_env({}));
  Probe probe;
  torch::optim::SGD sgd(probe->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(probe, sgd);
  auto out = model(torch::randn({4, 8}));
  CHECK(probe->activation == torch::kBFloat16);
  CHECK(out.scalar_type() == torch::kFloat32);
}

TEST_CASE("cuda: the loss scaler's AMP kernels agree with its CPU path", "[gpu]") {
  const std::vector<float> grads = {1.0f, INFINITY, 1.0f, 1.0f, NAN, 1.0f};
  auto [cpu_scale, cpu_tracker, cpu_weight] = drive_scaler(torch::kCPU, grads);
  auto [gpu_scale, gpu_tracker, gpu_weight] = drive_scaler(torch::kCUDA, grads);
  CHECK(gpu_scale == cpu_scale);
  CHECK(gpu_tracker == cpu_tracker);
  CHECK(torch::allclose(gpu_weight, cpu_weight));
}
