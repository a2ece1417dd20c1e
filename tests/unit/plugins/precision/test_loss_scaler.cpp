// The dynamic loss scaler on CPU (ATen's AMP kernels; the same on CUDA is in tests/gpu), its
// use by Fabric through a MixedPrecision plugin, "16-mixed" on CPU, and init_module(empty_init).
#include <cmath>
#include <torch/torch.h>

#include "lightning/fabric/connector.h"
#include "lightning/fabric.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;

namespace {
struct OneParameter {
  torch::Tensor weight = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD sgd{std::vector<torch::Tensor>{weight}, torch::optim::SGDOptions(1.0)};
  // What a backward through fabric.backward does to the scaler: the loss is scaled, gradients appear.
  void set_grad(lf::LossScaler& scaler, float a, float b) {
    (void)scaler.scale(torch::ones({}));
    weight.mutable_grad() = torch::tensor({a, b});
  }
};
lf::LossScaler small_scaler(int64_t growth_interval = 3) {
  lf::LossScalerOptions options;
  options.init_scale = 8.0;
  options.growth_interval = growth_interval;
  return lf::LossScaler(options);
}
}  // namespace

TEST_CASE("LossScaler scales the loss and unscales gradients", "[scaler]") {
  auto scaler = small_scaler();
  CHECK(scaler.scale(torch::tensor(1.5f)).item<float>() == 12.0f);
  OneParameter p;
  p.set_grad(scaler, 8.0f, -16.0f);
  scaler.unscale_(p.sgd);
  CHECK(torch::equal(p.weight.grad(), torch::tensor({1.0f, -2.0f})));
  CHECK(scaler.step(p.sgd));  // already unscaled: not divided twice
  CHECK(torch::equal(p.weight.detach(), torch::tensor({0.0f, 3.0f})));
  scaler.update();
  CHECK(scaler.get_scale() == 8.0);
  CHECK(scaler.growth_tracker() == 1);
}

TEST_CASE("LossScaler skips the step on inf or NaN and backs off", "[scaler]") {
  auto scaler = small_scaler();
  OneParameter p;
  for (float bad : {INFINITY, NAN}) {
    p.set_grad(scaler, bad, 1.0f);
    CHECK_FALSE(scaler.step(p.sgd));
    scaler.update();
    CHECK(torch::equal(p.weight.detach(), torch::ones({2})));  // untouched
  }
  CHECK(scaler.get_scale() == 2.0);  // 8 * 0.5 * 0.5
  CHECK(scaler.growth_tracker() == 0);
}

TEST_CASE("LossScaler grows the scale after growth_interval clean steps, and an overflow resets the count",
          "[scaler]") {
  auto scaler = small_scaler(3);
  OneParameter p;
  auto clean_step = [&] {
    p.set_grad(scaler, 1.0f, 1.0f);
    REQUIRE(scaler.step(p.sgd));
    scaler.update();
  };
  clean_step();
  clean_step();
  p.set_grad(scaler, INFINITY, 1.0f);
  REQUIRE_FALSE(scaler.step(p.sgd));
  scaler.update();
  CHECK(scaler.get_scale() == 4.0);
  clean_step();
  clean_step();
  CHECK(scaler.get_scale() == 4.0);
  clean_step();
  CHECK(scaler.get_scale() == 8.0);
  CHECK(scaler.growth_tracker() == 0);
}

TEST_CASE("LossScaler state round trip with GradScaler's keys", "[scaler]") {
  auto scaler = small_scaler(5);
  OneParameter p;
  p.set_grad(scaler, 1.0f, 1.0f);
  scaler.step(p.sgd);
  scaler.update();
  auto state = scaler.state_dict();
  CHECK(state.at("scale").toDouble() == 8.0);
  CHECK(state.at("growth_interval").toInt() == 5);
  CHECK(state.at("_growth_tracker").toInt() == 1);
  CHECK(state.at("growth_factor").toDouble() == 2.0);
  CHECK(state.at("backoff_factor").toDouble() == 0.5);

  lf::LossScaler restored;
  restored.load_state_dict(state);
  CHECK(restored.get_scale() == 8.0);
  CHECK(restored.growth_tracker() == 1);
  CHECK(restored.options().growth_interval == 5);

  (void)state.erase("scale");
  CHECK_THROWS_WITH(restored.load_state_dict(state), Catch::Matchers::Contains("\"scale\" is missing"));
  state.insert("scale", std::string("big"));
  CHECK_THROWS_WITH(restored.load_state_dict(state), Catch::Matchers::Contains("must be a number"));
}

TEST_CASE("LossScaler refuses bad options, double unscale, double step and float16 gradients",
          "[scaler][errors]") {
  lf::LossScalerOptions bad;
  bad.growth_factor = 1.0;
  CHECK_THROWS_WITH(lf::LossScaler(bad), Catch::Matchers::Contains("growth_factor=1"));
  bad = {};
  bad.backoff_factor = 1.5;
  CHECK_THROWS_WITH(lf::LossScaler(bad), Catch::Matchers::Contains("backoff_factor=1.5"));
  bad = {};
  bad.growth_interval = 0;
  CHECK_THROWS_AS(lf::LossScaler(bad), lf::ValueError);

  auto scaler = small_scaler();
  OneParameter p;
  p.set_grad(scaler, 1.0f, 1.0f);
  scaler.unscale_(p.sgd);
  CHECK_THROWS_WITH(scaler.unscale_(p.sgd), Catch::Matchers::Contains("already called"));
  scaler.step(p.sgd);
  CHECK_THROWS_WITH(scaler.step(p.sgd), Catch::Matchers::Contains("already called"));
  scaler.update();

  OneParameter bypassed;
  bypassed.weight.mutable_grad() = torch::ones({2});  // a backward that never called scale()
  CHECK_THROWS_WITH(scaler.step(bypassed.sgd), Catch::Matchers::Contains("bypassed fabric.backward(loss)"));

  (void)scaler.scale(torch::ones({}));
  torch::Tensor half = torch::ones({2}, torch::TensorOptions().dtype(torch::kFloat16).requires_grad(true));
  torch::optim::SGD sgd(std::vector<torch::Tensor>{half}, 0.1);
  half.mutable_grad() = torch::ones({2}, torch::kFloat16);
  CHECK_THROWS_WITH(scaler.unscale_(sgd), Catch::Matchers::Contains("float16"));
}

TEST_CASE("Fabric with a loss-scaling precision: backward scales, step unscales and skips overflow",
          "[scaler][precision]") {
  lf::LossScalerOptions options;
  options.init_scale = 1024.0;
  auto scaler = std::make_shared<lf::LossScaler>(options);
  // bfloat16 autocast (CPU) with a scaler: the same code path "16-mixed" takes on CUDA.
  auto plugin = std::make_shared<lf::MixedPrecision>("bf16-mixed", torch::kBFloat16, scaler);
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").plugin(plugin), lf::env::map_env({}));
  torch::nn::Linear net(2, 1);
  torch::nn::init::ones_(net->weight);
  torch::nn::init::zeros_(net->bias);
  torch::optim::SGD sgd(net->parameters(), 0.5);
  auto [model, optimizer] = fabric.setup(net, sgd);

  auto x = torch::tensor({{1.0f, 2.0f}});
  fabric.backward(model(x).sum());
  CHECK(torch::allclose(net->weight.grad(), torch::tensor({{1024.0f, 2048.0f}})));  // scaled
  auto norm = fabric.clip_gradients(model, optimizer, lf::GradientClipping().norm(100.0));
  CHECK(norm->item<double>() == Approx(std::sqrt(6.0)).epsilon(1e-3));  // the norm after unscaling
  CHECK(optimizer.step());
  CHECK(torch::allclose(net->weight.detach(), torch::tensor({{0.5f, 0.0f}})));
  optimizer.zero_grad();

  fabric.backward(model(torch::tensor({{INFINITY, 1.0f}})).sum());
  CHECK_FALSE(optimizer.step());
  CHECK(torch::allclose(net->weight.detach(), torch::tensor({{0.5f, 0.0f}})));  // skipped
  CHECK(scaler->get_scale() == 512.0);
  CHECK(fabric.precision()->loss_scaler() == scaler);
}

TEST_CASE("16-mixed: float16 autocast with a loss scaler, on CPU it becomes bf16-mixed", "[precision]") {
  auto sixteen = lf::precision_registry().create("16-mixed");
  auto* mixed = dynamic_cast<lf::MixedPrecision*>(sixteen.get());
  REQUIRE(mixed != nullptr);
  CHECK(mixed->autocast_dtype() == torch::kFloat16);
  CHECK(mixed->loss_scaler() != nullptr);
  CHECK(mixed->loss_scaler()->get_scale() == 65536.0);
  CHECK(mixed->loss_scaler()->options().growth_interval == 2000);
  CHECK(lf::precision_registry().create("bf16-mixed")->loss_scaler() == nullptr);

  auto config = lf::resolve_config(lf::FabricOptions().accelerator("cpu").precision("16-mixed"), lf::env::map_env({}));
  CHECK(config.precision == "bf16-mixed");
  REQUIRE(config.warnings.size() == 1);
  CHECK_THAT(config.warnings[0], Catch::Matchers::Contains("not supported on CPU"));
}

TEST_CASE("16-mixed refuses closures (LBFGS)", "[precision][errors]") {
  lf::MixedPrecision plugin("16-mixed", torch::kFloat16, std::make_shared<lf::LossScaler>());
  OneParameter p;
  CHECK_THROWS_WITH(plugin.optimizer_step(p.sgd, [] { return torch::zeros({}); }),
                    Catch::Matchers::Contains("closure"));
}

TEST_CASE("init_module(empty_init=true) skips random initialisation but keeps constant fills", "[init]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({}));
  torch::manual_seed(7);
  const auto expected_next = torch::rand({4});
  torch::manual_seed(7);
  const auto seeded_linear = torch::nn::Linear(64, 64);
  torch::manual_seed(7);
  torch::nn::Linear linear{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  {
    auto empty = fabric.init_module(/*empty_init=*/true);
    linear = torch::nn::Linear(64, 64);
    norm = torch::nn::BatchNorm1d(8);
  }
  CHECK(torch::equal(torch::rand({4}), expected_next));  // the generator did not advance
  CHECK_FALSE(torch::equal(linear->weight, seeded_linear->weight));
  CHECK(torch::equal(norm->running_var, torch::ones({8})));  // constant fills still run
  CHECK(torch::equal(norm->weight.detach(), torch::ones({8})));
  // The guard ended: random fills work again, and init_module() alone initialises as usual.
  torch::manual_seed(7);
  torch::nn::Linear normal{nullptr};
  {
    auto guard = fabric.init_module();
    normal = torch::nn::Linear(64, 64);
  }
  CHECK(torch::equal(normal->weight, seeded_linear->weight));
}

TEST_CASE("empty_init under bf16-true: parameters in bfloat16, uninitialised", "[init]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").precision("bf16-true"), lf::env::map_env({}));
  torch::manual_seed(3);
  const auto expected_next = torch::rand({2});
  torch::manual_seed(3);
  torch::nn::Linear linear{nullptr};
  {
    auto empty = fabric.init_module(true);
    linear = torch::nn::Linear(16, 16);
  }
  CHECK(linear->weight.scalar_type() == torch::kBFloat16);
  CHECK(torch::equal(torch::rand({2}), expected_next));
}
