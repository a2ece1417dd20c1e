// The multi-tensor gradient norm and clipping (lib/src/internal/gradient_norm.cpp) against
// LibTorch's per-parameter clip_grad_norm_, for several norm orders, with parameters that have no
// gradient or no elements; and through fabric.clip_gradients on one process.
#include <torch/torch.h>

#include <cmath>

#include "lightning/fabric.h"
#include "lightning/fabric/internal/gradient_norm.h"

#include <catch2/catch.hpp>

namespace lf = lightning::fabric;

namespace {
// Parameters of several shapes with random gradients, and one without a gradient. (No empty one:
// LibTorch's clip_grad_norm_, the reference, throws on an empty gradient for the infinity norm.)
std::vector<at::Tensor> parameters_with_gradients(uint64_t seed, double scale) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> parameters;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{7, 3}, {5}, {2, 2, 4}, {9}, {1}}) {
    auto parameter = torch::randn(shape).requires_grad_();
    parameter.mutable_grad() = torch::randn(shape) * scale;
    parameters.push_back(parameter);
  }
  parameters.push_back(torch::randn({3}).requires_grad_());  // no gradient
  return parameters;
}

std::vector<at::Tensor> copies(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> result;
  for (const auto& parameter : parameters) {
    auto copy = parameter.detach().clone().requires_grad_();
    if (parameter.grad().defined()) copy.mutable_grad() = parameter.grad().clone();
    result.push_back(copy);
  }
  return result;
}
}  // namespace

TEST_CASE("gradient norm: the multi-tensor path equals clip_grad_norm_ for every order", "[clip]") {
  for (double norm_type : {2.0, 1.0, 3.5, static_cast<double>(INFINITY)}) {
    for (double max_norm : {0.5, 1000.0}) {  // clipping, and a norm under the limit (unchanged)
      auto ours = parameters_with_gradients(3, 2.0);
      auto reference = copies(ours);
      const double expected = torch::nn::utils::clip_grad_norm_(reference, max_norm, norm_type);
      auto grads = lf::internal::gradients_of(ours);
      CHECK(grads.size() == 5);  // the gradient-less parameter is left out
      const auto total = lf::internal::total_norm_from(lf::internal::local_norm_part(grads, norm_type, at::kCPU), norm_type);
      CHECK(total.scalar_type() == at::kDouble);
      CHECK(total.item<double>() == Approx(expected).epsilon(1e-6));
      lf::internal::scale_to_max_norm(grads, total, max_norm);
      for (size_t i = 0; i < ours.size(); ++i) {
        if (!reference[i].grad().defined()) continue;
        if (max_norm > expected) {
          CHECK(torch::equal(ours[i].grad(), reference[i].grad()));  // factor 1: bitwise unchanged
        } else {
          CHECK(torch::allclose(ours[i].grad(), reference[i].grad(), 1e-6, 1e-7));
        }
      }
    }
  }
}

TEST_CASE("gradient norm: empty and missing gradients are left out, no gradients give zero", "[clip]") {
  auto empty = torch::randn({0}).requires_grad_();
  empty.mutable_grad() = torch::zeros({0});
  auto one = torch::randn({2}).requires_grad_();
  one.mutable_grad() = torch::tensor({3.0f, -4.0f});
  const auto grads = lf::internal::gradients_of({empty, one, torch::randn({2}).requires_grad_()});
  REQUIRE(grads.size() == 1);
  const double infinity = INFINITY;
  CHECK(lf::internal::local_norm_part(grads, infinity, at::kCPU).item<double>() == 4.0);
  CHECK(lf::internal::total_norm_from(lf::internal::local_norm_part(grads, 2.0, at::kCPU), 2.0).item<double>() ==
        Approx(5.0));
  std::vector<at::Tensor> none;
  CHECK(lf::internal::local_norm_part(none, 2.0, at::kCPU).item<double>() == 0.0);
  CHECK_NOTHROW(lf::internal::scale_to_max_norm(none, torch::zeros({}, torch::kDouble), 1.0));
}

TEST_CASE("gradient norm: fabric.clip_gradients on one process matches clip_grad_norm_", "[clip]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({}));
  torch::manual_seed(11);
  torch::nn::Linear net(6, 4);
  torch::nn::Linear reference(6, 4);
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(net->weight);
    reference->bias.copy_(net->bias);
  }
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  const auto input = torch::randn({8, 6}) * 10;
  fabric.backward(model(input).pow(2).sum());
  reference(input).pow(2).sum().backward();
  const auto norm = fabric.clip_gradients(model, optimizer, lf::GradientClipping().norm(0.1));
  const double expected = torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.1);
  REQUIRE(norm.has_value());
  CHECK(norm->item<double>() == Approx(expected).epsilon(1e-6));
  CHECK(torch::allclose(net->weight.grad(), reference->weight.grad(), 1e-6, 1e-7));
  CHECK(torch::allclose(net->bias.grad(), reference->bias.grad(), 1e-6, 1e-7));
}
