// FabricModule, FabricOptimizer and the nested-container helpers.
#include <torch/torch.h>

#include "lightning/fabric.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

namespace {
lf::Fabric cpu_fabric(const std::string& precision = "32-true") {
  return lf::Fabric(lf::FabricOptions().accelerator("cpu").precision(precision), lf::env::map_env({}));
}

// A forward with several arguments of different kinds and a tuple result.
struct MultiImpl : torch::nn::Module {
  MultiImpl() : fc(register_module("fc", torch::nn::Linear(2, 2))) {
    register_buffer("running", torch::zeros({2}));
  }
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const std::vector<torch::Tensor>& extra,
                                                   double scale, int64_t steps) {
    auto y = fc(x) * scale;
    for (const auto& e : extra) y = y + e;
    return {y, torch::full({1}, static_cast<double>(steps), x.options())};
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Multi);

struct SideEffectImpl : torch::nn::Module {
  void forward(const torch::Tensor& x) { seen = x.scalar_type(); }
  c10::ScalarType seen = torch::kInt;
};
}  // namespace

TEST_CASE("FabricModule forwards any signature and guards tensor outputs", "[wrappers]") {
  auto fabric = cpu_fabric("64-true");
  Multi net;
  auto model = fabric.setup(net);
  auto [y, steps] = model(torch::ones({3, 2}), std::vector<torch::Tensor>{torch::ones({3, 2})}, 2.0, int64_t{7});
  CHECK(y.scalar_type() == torch::kFloat32);  // computed in float64, returned in the default dtype
  CHECK(steps.item<double>() == 7.0);
  auto side = fabric.setup(std::make_shared<SideEffectImpl>());
  side(torch::ones({1}));
  CHECK(side->seen == torch::kFloat64);
}

TEST_CASE("loss.backward() on a FabricModule output says to call fabric.backward", "[wrappers][errors]") {
  auto fabric = cpu_fabric();
  torch::nn::Linear net(2, 1);
  auto model = fabric.setup(net);
  auto loss = model(torch::ones({4, 2})).sum();
  try {
    loss.backward();
    FAIL("loss.backward() should have been refused");
  } catch (const std::exception& error) {
    CHECK_THAT(std::string(error.what()), Contains("fabric.backward(loss)"));
  }
  auto again = model(torch::ones({4, 2})).sum();
  CHECK_NOTHROW(fabric.backward(again));
  CHECK(net->weight.grad().defined());
  torch::NoGradGuard no_grad;  // outputs without grad carry no hook
  auto plain = model(torch::ones({4, 2}));
  CHECK_FALSE(plain.requires_grad());
}

TEST_CASE("FabricModule state dict has the original names and loads back", "[wrappers]") {
  auto fabric = cpu_fabric();
  Multi net;
  auto model = fabric.setup(net);
  auto state = model.state_dict();
  std::vector<std::string> keys;
  for (const auto& item : state) keys.push_back(item.key().toStringRef());
  CHECK(keys == std::vector<std::string>{"fc.weight", "fc.bias", "running"});
  lf::StateDict zeros = lf::make_state_dict();
  for (const auto& item : state) zeros.insert(item.key(), torch::zeros_like(item.value().toTensor()));
  model.load_state_dict(zeros);
  CHECK(net->fc->weight.abs().sum().item<double>() == 0.0);
  lf::StateDict partial = lf::make_state_dict();
  partial.insert("fc.bias", torch::ones({2}));
  partial.insert("other", torch::ones({2}));
  CHECK_THROWS_WITH(model.load_state_dict(partial), Contains("Missing keys: [fc.weight, running]") &&
                                                          Contains("unexpected keys: [other]"));
  model.load_state_dict(partial, /*strict=*/false);
  CHECK(net->fc->bias.sum().item<double>() == 2.0);
  lf::StateDict wrong = lf::make_state_dict();
  wrong.insert("fc.bias", torch::ones({3}));
  CHECK_THROWS_WITH(model.load_state_dict(wrong, false), Contains("'fc.bias' has shape [3]"));
}

TEST_CASE("FabricModule exposes train/eval and parameters of the original", "[wrappers]") {
  auto fabric = cpu_fabric();
  torch::nn::Dropout dropout(0.5);
  auto model = fabric.setup(dropout);
  model.eval();
  CHECK_FALSE(dropout->is_training());
  model.train();
  CHECK(model.is_training());
  CHECK(model.parameters().empty());
}

TEST_CASE("FabricOptimizer zero_grad releases by default or zeroes in place", "[wrappers]") {
  auto fabric = cpu_fabric();
  torch::nn::Linear net(2, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  fabric.backward(model(torch::ones({1, 2})).sum());
  auto grad = net->weight.grad();
  optimizer.zero_grad(/*set_to_none=*/false);
  CHECK(net->weight.grad().defined());
  CHECK(net->weight.grad().data_ptr() == grad.data_ptr());  // same storage: in place
  CHECK(net->weight.grad().abs().sum().item<double>() == 0.0);
  optimizer.zero_grad();  // Python's and LibTorch 2.x's default: set_to_none
  CHECK_FALSE(net->weight.grad().defined());
  CHECK(optimizer->param_groups().size() == 1);
}

TEST_CASE("apply_to_tensors reaches tensors in nested containers", "[utilities]") {
  std::map<std::string, std::tuple<torch::Tensor, std::vector<torch::Tensor>, int>> nested;
  nested["a"] = {torch::ones({1}), {torch::ones({2}), torch::ones({3})}, 5};
  std::optional<torch::Tensor> maybe = torch::ones({1});
  auto doubled = lf::apply_to_tensors(nested, [](const torch::Tensor& t) { return t * 2; });
  CHECK(std::get<0>(doubled["a"]).item<float>() == 2.0f);
  CHECK(std::get<1>(doubled["a"])[1].sum().item<float>() == 6.0f);
  CHECK(std::get<2>(doubled["a"]) == 5);
  CHECK(std::get<0>(nested["a"]).item<float>() == 1.0f);  // the input is untouched
  CHECK(lf::apply_to_tensors(maybe, [](const torch::Tensor& t) { return t + 1; })->item<float>() == 2.0f);
  auto example = lf::apply_to_tensors(torch::data::Example<>(torch::ones({1}), torch::zeros({1})),
                                      [](const torch::Tensor& t) { return t.to(torch::kFloat64); });
  CHECK(example.target.scalar_type() == torch::kFloat64);
  auto moved = lf::move_data_to_device(std::make_pair(torch::ones({1}), std::string("x")), torch::Device(torch::kCPU));
  CHECK(moved.second == "x");
}

TEST_CASE("to_device moves data and modules", "[fabric]") {
  auto fabric = cpu_fabric();
  auto batch = fabric.to_device(std::vector<torch::Tensor>{torch::ones({1})});
  CHECK(batch[0].device() == fabric.device());
  torch::nn::Linear net(1, 1);
  CHECK(fabric.to_device(net)->weight.device() == fabric.device());
}

TEST_CASE("print writes on local rank 0", "[fabric]") {
  auto fabric = cpu_fabric();
  std::ostringstream captured;
  auto* previous = std::cout.rdbuf(captured.rdbuf());
  fabric.print("epoch", 3, "loss", 0.5);
  std::cout.rdbuf(previous);
  CHECK(captured.str() == "epoch 3 loss 0.5\n");
}

TEST_CASE("scope guards run once, innermost first", "[utilities]") {
  std::vector<int> order;
  {
    lf::ScopeGuard outer([&] { order.push_back(1); });
    auto both = std::move(outer).then(lf::ScopeGuard([&] { order.push_back(2); }));
    lf::ScopeGuard moved = std::move(both);
  }
  CHECK(order == std::vector<int>{2, 1});
}
