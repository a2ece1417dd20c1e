// GPU checks of fused optimizer steps and CapturedStep on CUDA: fused AdamW against LibTorch's
// step, 16-mixed's overflow skipped inside the kernel, a captured step's weights against the
// eager loop's (with a scheduler), and a captured step's refusals that need a GPU.
#include <torch/torch.h>

#include <optional>
#include <sstream>

#include "lightning/fabric.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

namespace {
struct MlpImpl : torch::nn::Module {
  MlpImpl() : fc1(register_module("fc1", torch::nn::Linear(16, 32))), fc2(register_module("fc2", torch::nn::Linear(32, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

std::vector<std::pair<torch::Tensor, torch::Tensor>> cuda_batches(int count) {
  torch::manual_seed(5);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = 0; i < count; ++i) {
    batches.emplace_back(torch::randn({8, 16}, torch::kCUDA), torch::randint(4, {8}, torch::TensorOptions(torch::kLong).device(torch::kCUDA)));
  }
  return batches;
}
}  // namespace

TEST_CASE("cuda: fused AdamW follows LibTorch's AdamW over 20 steps", "[gpu][fused]") {
  const auto batches = cuda_batches(20);
  auto train = [&](bool fused) {
    lf::Fabric fabric(lf::FabricOptions().accelerator("cuda").fused_optimizer_steps(fused), lf::env::map_env({}));
    torch::manual_seed(1);
    Mlp net;
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2).amsgrad(true));
    auto [model, optimizer] = fabric.setup(net, adamw);
    CHECK(optimizer.fused() == fused);
    for (const auto& [x, y] : batches) {
      optimizer.zero_grad();
      fabric.backward(torch::nn::functional::cross_entropy(model(x), y));
      optimizer.step();
    }
    return net->fc1->weight.detach().cpu();
  };
  CHECK(torch::allclose(train(true), train(false), 1e-5, 1e-6));
}

TEST_CASE("cuda: 16-mixed with a fused step skips an overflow inside the kernel", "[gpu][fused][scaler]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cuda").precision("16-mixed"), lf::env::map_env({}));
  torch::manual_seed(1);
  Mlp net;
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  auto [model, optimizer] = fabric.setup(net, adam);
  REQUIRE(optimizer.fused());
  const auto before = net->fc1->weight.detach().clone();
  fabric.backward(model(torch::full({8, 16}, INFINITY, torch::kCUDA)).sum());
  CHECK_FALSE(optimizer.step());
  CHECK(torch::equal(net->fc1->weight, before));
  CHECK(adam.state().empty());
  optimizer.zero_grad();
  fabric.backward(model(torch::randn({8, 16}, torch::kCUDA)).pow(2).mean());
  CHECK(optimizer.step());
  CHECK_FALSE(torch::equal(net->fc1->weight, before));
}

TEST_CASE("cuda: a captured step trains as the eager loop does, scheduler included", "[gpu][capture]") {
  const auto batches = cuda_batches(12);
  auto train = [&](bool capture) {
    lf::Fabric fabric(lf::FabricOptions().accelerator("cuda").precision("bf16-mixed"), lf::env::map_env({}));
    torch::manual_seed(1);
    Mlp net;
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2));
    torch::optim::StepLR schedule(adamw, 4, 0.5);
    auto setup = fabric.setup(net, adamw);  // (C++17 lambdas cannot capture structured bindings)
    auto& model = std::get<0>(setup);
    auto& optimizer = std::get<1>(setup);
    auto step = [&](const std::vector<torch::Tensor>& in) {
      auto loss = torch::nn::functional::cross_entropy(model(in[0]), in[1]);
      fabric.backward(loss);
      return loss;
    };
    std::optional<lf::CapturedStep> captured;
    if (capture) captured.emplace(fabric, optimizer, step);
    for (const auto& [x, y] : batches) {
      if (capture) {
        (*captured)({x, y});
      } else {
        optimizer.zero_grad();
        step({x, y});
        optimizer.step();
      }
      schedule.step();
    }
    if (capture) CHECK(captured->captured());
    const auto& state = static_cast<torch::optim::AdamWParamState&>(*adamw.state().at(net->fc1->weight.unsafeGetTensorImpl()));
    CHECK(state.step() == 12);
    return net->fc1->weight.detach().cpu();
  };
  const auto eager = train(false);
  const auto replayed = train(true);
  INFO("max |captured - eager|: " << (eager - replayed).abs().max().item<double>());
  CHECK(torch::allclose(eager, replayed, 1e-4, 1e-5));
}

TEST_CASE("cuda: a captured step refuses a host sync, other shapes and a replaced state", "[gpu][capture][errors]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cuda"), lf::env::map_env({}));
  torch::manual_seed(1);
  Mlp net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto setup = fabric.setup(net, sgd);  // (C++17 lambdas cannot capture structured bindings)
  auto& model = std::get<0>(setup);
  auto& optimizer = std::get<1>(setup);
  const auto batch = cuda_batches(1).front();
  lf::CaptureOptions one;
  one.warmup_steps = 1;
  {
    lf::CapturedStep syncing(fabric, optimizer, [&](const std::vector<torch::Tensor>& in) {
      auto loss = model(in[0]).pow(2).mean();
      if (loss.item<float>() > 1e9) loss = loss * 0;  // a host read: not recordable
      fabric.backward(loss);
      return loss;
    }, one);
    syncing({batch.first});  // the warm-up runs eagerly
    CHECK_THROWS_WITH(syncing({batch.first}), Contains("capturing the step as a CUDA graph failed") && Contains(".item()"));
  }
  for (int stepping = 0; stepping < 3; ++stepping) {  // the Fabric optimizer's step, zero_grad, LibTorch's step
    lf::CapturedStep twice(fabric, optimizer, [&](const std::vector<torch::Tensor>& in) {
      auto loss = model(in[0]).pow(2).mean();
      fabric.backward(loss);
      if (stepping == 0) optimizer.step();
      if (stepping == 1) optimizer.zero_grad();
      if (stepping == 2) sgd.step();
      return loss;
    }, one);
    CHECK_THROWS_WITH(twice({batch.first}), Contains("CapturedStep") && Contains("steps the optimizer itself"));
  }
  lf::CapturedStep step(fabric, optimizer, [&](const std::vector<torch::Tensor>& in) {
    auto loss = model(in[0]).pow(2).mean();
    fabric.backward(loss);
    return loss;
  }, one);
  step({batch.first});
  step({batch.first});
  CHECK(step.captured());
  CHECK_THROWS_WITH(step({torch::randn({5, 16}, torch::kCUDA)}), Contains("input 0 has shape [5, 16]"));
  torch::serialize::OutputArchive archive;
  sgd.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  std::istringstream in(bytes.str());
  torch::serialize::InputArchive loaded;
  loaded.load_from(in);
  sgd.load(loaded);  // new state objects: the graph would update the old ones
  CHECK_THROWS_WITH(step({batch.first}), Contains("replaced after the capture"));
}
