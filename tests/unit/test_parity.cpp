// Single-device parity: the Fabric loop and the raw LibTorch loop, same seed, same data, give
// bitwise-identical weights after 50 steps when Fabric steps through LibTorch's optimizer, and
// weights within float rounding when it steps through the fused kernels (its default).
#include <torch/torch.h>

#include "lightning/fabric.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;

namespace {
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(16, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

constexpr int kSteps = 50;

std::vector<torch::Tensor> batches() {
  torch::manual_seed(1234);
  std::vector<torch::Tensor> data;
  for (int i = 0; i < kSteps; ++i) data.push_back(torch::randn({8, 16}));
  return data;
}

std::vector<torch::Tensor> raw_loop(const std::vector<torch::Tensor>& data) {
  torch::manual_seed(7);
  Mlp net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (const auto& x : data) {
    sgd.zero_grad();
    auto loss = torch::cross_entropy_loss(net(x), x.argmax(1) % 4);
    loss.backward();
    sgd.step();
  }
  return net->parameters();
}

std::vector<torch::Tensor> fabric_loop(const std::vector<torch::Tensor>& data, bool fused) {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").fused_optimizer_steps(fused), lf::env::map_env({}));
  fabric.seed_everything(7);
  Mlp net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto [model, optimizer] = fabric.setup(net, sgd);
  for (const auto& x : data) {
    optimizer.zero_grad();
    auto loss = torch::cross_entropy_loss(model(x), x.argmax(1) % 4);
    fabric.backward(loss);
    optimizer.step();
  }
  return net->parameters();
}
}  // namespace

TEST_CASE("Fabric loop and raw LibTorch loop are bitwise identical after 50 steps", "[parity]") {
  const auto data = batches();
  const auto raw = raw_loop(data);
  const auto fabric = fabric_loop(data, /*fused=*/false);
  const auto fused = fabric_loop(data, /*fused=*/true);
  REQUIRE(raw.size() == fabric.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    CHECK(torch::equal(raw[i], fabric[i]));
    CHECK(torch::allclose(raw[i], fused[i], /*rtol=*/1e-5, /*atol=*/1e-6));
  }
  torch::manual_seed(7);
  CHECK_FALSE(torch::equal(raw[0], Mlp()->parameters()[0]));  // training did move the weights
}
