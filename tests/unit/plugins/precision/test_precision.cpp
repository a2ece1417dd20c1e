// Precision plugins on CPU: dtypes of parameters, of activations inside the forward, of outputs,
// and of tensors created in the init contexts.
#include <ATen/autocast_mode.h>

#include <cmath>
#include <torch/torch.h>

#include "lightning/fabric.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;

namespace {
lf::Fabric fabric_with(const std::string& precision) {
  return lf::Fabric(lf::FabricOptions().accelerator("cpu").precision(precision), lf::env::map_env({}));
}

// Records the dtype of its hidden activation and of a tensor created inside forward.
struct ProbeImpl : torch::nn::Module {
  ProbeImpl() : fc(register_module("fc", torch::nn::Linear(4, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    input = x.scalar_type();
    auto hidden = fc(x);
    activation = hidden.scalar_type();
    created = torch::zeros({1}).scalar_type();
    return hidden;
  }
  torch::nn::Linear fc;
  c10::ScalarType input = torch::kInt, activation = torch::kInt, created = torch::kInt;
};
TORCH_MODULE(Probe);
}  // namespace

TEST_CASE("bf16-mixed: float32 parameters, bfloat16 activations, float32 outputs", "[precision]") {
  auto fabric = fabric_with("bf16-mixed");
  Probe probe;
  torch::optim::SGD sgd(probe->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(probe, sgd);
  CHECK(probe->fc->weight.scalar_type() == torch::kFloat32);
  auto out = model(torch::randn({2, 4}));
  CHECK(probe->input == torch::kBFloat16);
  CHECK(probe->activation == torch::kBFloat16);
  CHECK(out.scalar_type() == torch::kFloat32);
  fabric.backward(out.sum());
  CHECK(probe->fc->weight.grad().scalar_type() == torch::kFloat32);
  CHECK(optimizer.step());
  CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));  // the forward's autocast ended with it
}

TEST_CASE("fabric.autocast() applies the precision outside the forward and nests", "[precision]") {
  auto fabric = fabric_with("bf16-mixed");
  auto a = torch::randn({2, 2}), b = torch::randn({2, 2});
  {
    auto outer = fabric.autocast();
    CHECK(torch::mm(a, b).scalar_type() == torch::kBFloat16);
    {
      auto inner = fabric.autocast();
      CHECK(at::autocast::is_autocast_enabled(at::kCPU));
    }
    CHECK(at::autocast::is_autocast_enabled(at::kCPU));  // the inner guard restored, not disabled
  }
  CHECK(torch::mm(a, b).scalar_type() == torch::kFloat32);
  auto full = fabric_with("32-true");
  auto none = full.autocast();
  CHECK(torch::mm(a, b).scalar_type() == torch::kFloat32);
}

TEST_CASE("mixed precision autocasts the device type in use only", "[precision]") {
  auto fabric = fabric_with("bf16-mixed");
  auto& mixed = dynamic_cast<lf::MixedPrecision&>(*fabric.precision());
  CHECK(mixed.device_type() == c10::DeviceType::CPU);  // set by the Connector from the accelerator
  {
    auto autocast = fabric.autocast();
    CHECK(at::autocast::is_autocast_enabled(at::kCPU));
    CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCUDA));
  }
  // A CUDA model (the flags are per thread, so this runs without a GPU): CPU autocast stays off.
  lf::MixedPrecision cuda("bf16-mixed", torch::kBFloat16);
  cuda.set_device_type(c10::DeviceType::CUDA);
  {
    auto autocast = cuda.forward_context();
    CHECK(at::autocast::is_autocast_enabled(at::kCUDA));
    CHECK(at::autocast::get_autocast_dtype(at::kCUDA) == torch::kBFloat16);
    CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  }
  CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCUDA));  // restored
}

TEST_CASE("bf16-true: everything in bfloat16, outputs in float32", "[precision]") {
  auto fabric = fabric_with("bf16-true");
  Probe probe;
  auto model = fabric.setup(probe);
  CHECK(probe->fc->weight.scalar_type() == torch::kBFloat16);
  auto out = model(torch::randn({2, 4}));
  CHECK(probe->input == torch::kBFloat16);
  CHECK(probe->activation == torch::kBFloat16);
  CHECK(probe->created == torch::kBFloat16);  // the forward runs under the dtype context
  CHECK(out.scalar_type() == torch::kFloat32);
  auto tensor_guard = fabric.init_tensor();
  CHECK(torch::ones({1}).scalar_type() == torch::kBFloat16);
}

TEST_CASE("16-true converts the module and the init contexts to float16", "[precision]") {
  auto fabric = fabric_with("16-true");
  torch::nn::Linear net(2, 2);
  fabric.setup(net);
  CHECK(net->weight.scalar_type() == torch::kFloat16);
  {
    auto guard = fabric.init_module();
    torch::nn::Linear built(2, 2);
    CHECK(built->weight.scalar_type() == torch::kFloat16);
  }
  CHECK(torch::ones({1}).scalar_type() == torch::kFloat32);
}

TEST_CASE("32-true leaves dtypes alone", "[precision]") {
  auto fabric = fabric_with("32-true");
  Probe probe;
  auto model = fabric.setup(probe);
  auto out = model(torch::randn({2, 4}));
  CHECK(probe->activation == torch::kFloat32);
  CHECK(out.scalar_type() == torch::kFloat32);
}

TEST_CASE("clip_gradients by norm and by value, against a hand computation", "[clip]") {
  auto fabric = fabric_with("32-true");
  torch::nn::Linear net(2, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  auto set_grads = [&] {
    net->weight.mutable_grad() = torch::tensor({{3.0f, 0.0f}});
    net->bias.mutable_grad() = torch::tensor({4.0f});
  };
  set_grads();
  auto norm = fabric.clip_gradients(model, optimizer, lf::GradientClipping().norm(1.0));
  REQUIRE(norm.has_value());
  CHECK(norm->item<double>() == Approx(5.0));  // sqrt(3^2 + 4^2)
  CHECK(net->weight.grad()[0][0].item<float>() == Approx(0.6).epsilon(1e-4));
  CHECK(net->bias.grad()[0].item<float>() == Approx(0.8).epsilon(1e-4));
  set_grads();
  CHECK_FALSE(fabric.clip_gradients(model, optimizer, lf::GradientClipping().value(2.0)).has_value());
  CHECK(net->weight.grad()[0][0].item<float>() == 2.0f);
  CHECK(net->bias.grad()[0].item<float>() == 2.0f);
  set_grads();
  auto inf_norm = fabric.clip_gradients(model, optimizer, lf::GradientClipping().norm(10.0, INFINITY));
  CHECK(inf_norm->item<double>() == Approx(4.0));
  CHECK(net->bias.grad()[0].item<float>() == 4.0f);  // under the limit: untouched
}

TEST_CASE("clip_gradients needs exactly one method and refuses non-finite norms", "[clip][errors]") {
  auto fabric = fabric_with("32-true");
  torch::nn::Linear net(2, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  net->weight.mutable_grad() = torch::full({1, 2}, INFINITY);
  CHECK_THROWS_WITH(fabric.clip_gradients(model, optimizer, lf::GradientClipping().value(1).norm(1)),
                    Catch::Matchers::Contains("not both"));
  CHECK_THROWS_WITH(fabric.clip_gradients(model, optimizer, lf::GradientClipping()),
                    Catch::Matchers::Contains("give clip_val"));
  CHECK_THROWS(fabric.clip_gradients(model, optimizer, lf::GradientClipping().norm(1.0)));
  CHECK_NOTHROW(fabric.clip_gradients(model, optimizer, lf::GradientClipping().norm(1.0).nonfinite_is_error(false)));
}
