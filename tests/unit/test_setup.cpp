// Fabric::setup and its two-step form: the four model/optimizer patterns of the seed article and
// every validation error.
#include <torch/torch.h>

#include "lightning/fabric.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <iostream>
#include <sstream>
#include <type_traits>

#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

namespace {
lf::Fabric cpu_fabric(const std::string& precision = "32-true") {
  return lf::Fabric(lf::FabricOptions().accelerator("cpu").precision(precision), lf::env::map_env({}));
}

struct EncoderImpl : torch::nn::Module {
  EncoderImpl() : fc(register_module("fc", torch::nn::Linear(8, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Encoder);

struct DecoderImpl : torch::nn::Module {
  DecoderImpl() : fc(register_module("fc", torch::nn::Linear(3, 8))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Decoder);

// Pattern 3: encoder and decoder grouped under one parent module.
struct AutoEncoderImpl : torch::nn::Module {
  AutoEncoderImpl() : encoder(register_module("encoder", Encoder())), decoder(register_module("decoder", Decoder())) {}
  torch::Tensor forward(const torch::Tensor& x) { return decoder(encoder(x)); }
  Encoder encoder;
  Decoder decoder;
};
TORCH_MODULE(AutoEncoder);

// A module whose two layers get different optimizers (pattern 2).
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl() : layer1(register_module("layer1", torch::nn::Linear(4, 4))), layer2(register_module("layer2", torch::nn::Linear(4, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return layer2(torch::relu(layer1(x))); }
  torch::nn::Linear layer1, layer2;
};
TORCH_MODULE(TwoLayer);

bool changed(const std::vector<torch::Tensor>& before, const std::vector<torch::Tensor>& after) {
  for (size_t i = 0; i < before.size(); ++i) {
    if (!torch::equal(before[i], after[i])) return true;
  }
  return false;
}
std::vector<torch::Tensor> snapshot(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> copies;
  for (const auto& p : params) copies.push_back(p.detach().clone());
  return copies;
}
}  // namespace

// A copy of a Fabric would share the strategy but not the launch state (it could start the
// workers twice): copying is refused at compile time.
static_assert(!std::is_copy_constructible_v<lf::Fabric> && !std::is_copy_assignable_v<lf::Fabric>,
              "Fabric must not be copyable");

TEST_CASE("pattern 1: one model and one optimizer", "[setup]") {
  auto fabric = cpu_fabric();
  torch::nn::Linear net(4, 2);
  torch::optim::Adam adam(net->parameters());
  auto [model, optimizer] = fabric.setup(net, adam);
  static_assert(std::is_same_v<decltype(model), lf::FabricModule<torch::nn::LinearImpl>>);
  static_assert(std::is_same_v<decltype(optimizer), lf::FabricOptimizer>);
  CHECK(model.module().get() == net.ptr().get());
  CHECK(&optimizer.optimizer() == &adam);
  auto before = snapshot(net->parameters());
  optimizer.zero_grad();
  fabric.backward(model(torch::ones({2, 4})).sum());
  CHECK(optimizer.step());
  CHECK(changed(before, net->parameters()));
}

TEST_CASE("pattern 2: one model, two optimizers and a scheduler, returned in input order", "[setup]") {
  auto fabric = cpu_fabric();
  TwoLayer net;
  auto sgd1 = std::make_shared<torch::optim::SGD>(net->layer1->parameters(), torch::optim::SGDOptions(0.003));
  torch::optim::SGD sgd2(net->layer2->parameters(), torch::optim::SGDOptions(0.01));
  torch::optim::StepLR scheduler(sgd2, /*step_size=*/1, /*gamma=*/0.5);
  auto [model, opt1, opt2, sched] = fabric.setup(net, sgd1, sgd2, scheduler);
  CHECK(&opt1.optimizer() == sgd1.get());
  CHECK(&opt2.optimizer() == &sgd2);
  CHECK(&sched == &scheduler);
  fabric.backward(model(torch::ones({3, 4})).sum());
  opt1.step();
  opt2.step();
  sched.step();  // LibTorch's StepLR changes the rate from its second step on
  sched.step();
  CHECK(static_cast<torch::optim::SGDOptions&>(sgd2.param_groups()[0].options()).lr() == Approx(0.005));
}

TEST_CASE("pattern 3: several models grouped under one parent, one optimizer", "[setup]") {
  auto fabric = cpu_fabric();
  AutoEncoder autoencoder;
  torch::optim::SGD sgd(autoencoder->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(autoencoder, sgd);
  auto encoder_before = snapshot(autoencoder->encoder->parameters());
  auto decoder_before = snapshot(autoencoder->decoder->parameters());
  auto x = torch::randn({5, 8});
  fabric.backward(torch::mse_loss(model(x), x));
  optimizer.step();
  CHECK(changed(encoder_before, autoencoder->encoder->parameters()));
  CHECK(changed(decoder_before, autoencoder->decoder->parameters()));
  CHECK(model.state_dict().contains("encoder.fc.weight"));
}

TEST_CASE("pattern 4: generator and discriminator set up separately", "[setup]") {
  auto fabric = cpu_fabric();
  Decoder generator;
  Encoder discriminator;
  torch::optim::Adam opt_g(generator->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  torch::optim::Adam opt_d(discriminator->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  auto [g, og] = fabric.setup(generator, opt_g);
  auto [d, od] = fabric.setup(discriminator, opt_d);
  auto d_before = snapshot(discriminator->parameters());
  auto g_before = snapshot(generator->parameters());
  od.zero_grad();
  fabric.backward(d(g(torch::randn({4, 3})).detach()).mean());
  od.step();
  og.zero_grad();
  fabric.backward(-d(g(torch::randn({4, 3}))).mean());
  og.step();
  CHECK(changed(d_before, discriminator->parameters()));
  CHECK(changed(g_before, generator->parameters()));
}

TEST_CASE("setup with only a module returns the FabricModule alone", "[setup]") {
  auto fabric = cpu_fabric();
  auto net = std::make_shared<torch::nn::LinearImpl>(2, 2);
  auto model = fabric.setup(net);
  static_assert(std::is_same_v<decltype(model), lf::FabricModule<torch::nn::LinearImpl>>);
  CHECK(model->weight.sizes() == torch::IntArrayRef({2, 2}));
}

TEST_CASE("a model passed twice is refused with Lightning's message", "[setup][errors]") {
  auto fabric = cpu_fabric();
  torch::nn::Linear net(2, 2);
  auto model = fabric.setup(net);
  CHECK_THROWS_AS(fabric.setup(net), lf::ValueError);
  CHECK_THROWS_WITH(fabric.setup(net), Contains("A model should be passed only once to the `setup` method."));
  CHECK_THROWS_WITH(fabric.setup(model), Contains("A model should be passed only once to the `setup` method.") &&
                                             Contains("already a FabricModule"));
  CHECK_THROWS_WITH(fabric.setup_module(net), Contains("A model should be passed only once"));
}

TEST_CASE("an optimizer passed twice is refused", "[setup][errors]") {
  auto fabric = cpu_fabric();
  torch::nn::Linear a(2, 2), b(2, 2), c(2, 2);
  torch::optim::SGD sgd(a->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(a, sgd);
  CHECK_THROWS_WITH(fabric.setup(b, sgd), Contains("An optimizer should be passed only once to the `setup` method."));
  CHECK_THROWS_WITH(fabric.setup(c, optimizer), Contains("already a FabricOptimizer"));
  torch::optim::SGD fresh(c->parameters(), 0.1);
  CHECK_THROWS_WITH(fabric.setup(c, fresh, fresh), Contains("appears twice"));
  CHECK_THROWS_WITH(fabric.setup_optimizers(optimizer), Contains("already a FabricOptimizer"));
}

TEST_CASE("a scheduler must come after every optimizer", "[setup][errors]") {
  auto fabric = cpu_fabric();
  torch::nn::Linear net(2, 2);
  torch::optim::SGD first(net->parameters(), 0.1), second(net->parameters(), 0.1);
  torch::optim::StepLR scheduler(first, 1);
  CHECK_THROWS_WITH(fabric.setup(net, first, scheduler, second), Contains("scheduler must come after every optimizer"));
}

TEST_CASE("two-step setup: setup_module then setup_optimizers", "[setup]") {
  auto fabric = cpu_fabric();
  torch::nn::Linear net(3, 1);
  auto model = fabric.setup_module(net);
  torch::optim::SGD sgd(model->parameters(), 0.5);
  auto optimizer = fabric.setup_optimizers(sgd);
  static_assert(std::is_same_v<decltype(optimizer), lf::FabricOptimizer>);
  torch::optim::SGD other(model->parameters(), 0.5);
  torch::optim::SGD third(model->parameters(), 0.5);
  auto [o1, o2] = fabric.setup_optimizers(other, third);
  CHECK(&o2.optimizer() == &third);
  CHECK_THROWS_WITH(fabric.setup_optimizers(sgd), Contains("only once"));
}

TEST_CASE("setup_optimizers without an optimizer is refused", "[setup][errors]") {
  auto fabric = cpu_fabric();
  CHECK_THROWS_WITH(fabric.setup_optimizers(), Contains("`setup_optimizers` requires at least one optimizer"));
}

namespace {
// A strategy that, like DeepSpeed or XLA in Python, needs module and optimizers together.
class JointOnlyStrategy : public lf::SingleDeviceStrategy {
 public:
  using SingleDeviceStrategy::SingleDeviceStrategy;
  std::string name() const override { return "joint_only"; }
  bool requires_joint_setup() const override { return true; }
};
}  // namespace

TEST_CASE("strategies that require joint setup refuse the two-step form", "[setup][errors]") {
  lf::strategy_registry().add(
      "joint_only", [](lf::StrategyContext c) { return std::make_shared<JointOnlyStrategy>(std::move(c)); }, "",
      /*override_existing=*/true);
  lf::Fabric fabric(lf::FabricOptions().strategy("joint_only"), lf::env::map_env({}));
  torch::nn::Linear net(2, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  CHECK_THROWS_WITH(fabric.setup_module(net), Contains("joint_only") && Contains("set up jointly"));
  CHECK_THROWS_AS(fabric.setup_optimizers(sgd), lf::RuntimeError);
  auto [model, optimizer] = fabric.setup(net, sgd);  // the joint form still works
  CHECK(model.module().get() == net.ptr().get());
}

TEST_CASE("64-true converts the module and casts inputs", "[setup][precision]") {
  auto fabric = cpu_fabric("64-true");
  torch::nn::Linear net(4, 2);
  auto model = fabric.setup(net);
  CHECK(net->weight.scalar_type() == torch::kFloat64);
  auto out = model(torch::ones({1, 4}, torch::kFloat32));
  CHECK(out.scalar_type() == torch::kFloat32);  // computed in float64, returned in the default dtype
  {
    auto guard = fabric.init_tensor();
    CHECK(torch::ones({1}).scalar_type() == torch::kFloat64);
  }
  CHECK(torch::ones({1}).scalar_type() == torch::kFloat32);
  {
    auto guard = fabric.init_module();
    torch::nn::Linear built(2, 2);
    CHECK(built->weight.scalar_type() == torch::kFloat64);
  }
}

TEST_CASE("launch refuses under the CLI and runs the function otherwise", "[launch]") {
  lf::Fabric under_cli(lf::FabricOptions(), lf::env::map_env({{"LT_CLI_USED", "1"}, {"LT_DEVICES", "1"}, {"LT_NUM_NODES", "1"}}));
  CHECK_THROWS_AS(under_cli.launch(), lf::RuntimeError);
  CHECK_THROWS_WITH(under_cli.launch(), Contains("lightning-run") && Contains("LT_CLI_USED=1"));
  auto fabric = cpu_fabric();
  CHECK(fabric.launch([](lf::Fabric& f) { return f.world_size() * 10 + f.global_rank(); }) == 10);
}

TEST_CASE("single-process identity: ranks, device, collectives", "[fabric]") {
  auto fabric = cpu_fabric();
  CHECK(fabric.global_rank() == 0);
  CHECK(fabric.local_rank() == 0);
  CHECK(fabric.node_rank() == 0);
  CHECK(fabric.world_size() == 1);
  CHECK(fabric.is_global_zero());
  CHECK(fabric.device() == torch::Device(torch::kCPU));
  auto t = torch::arange(3);
  CHECK(torch::equal(fabric.all_reduce(t, "sum"), t));
  CHECK(torch::equal(fabric.all_gather(t), t));
  CHECK(torch::equal(fabric.broadcast(t), t));
  CHECK_THROWS_WITH(fabric.all_reduce(t, "median"), Contains("reduce_op=\"median\"") && Contains("sum, mean"));
}

TEST_CASE("seed_everything seeds torch and records PL_GLOBAL_SEED", "[fabric]") {
  CHECK(lf::Fabric::seed_everything(123) == 123);
  CHECK(std::string(std::getenv("PL_GLOBAL_SEED")) == "123");
  auto a = torch::rand({4});
  lf::Fabric::seed_everything(123);
  CHECK(torch::equal(a, torch::rand({4})));
  CHECK(lf::Fabric::seed_everything() == 123);  // reuses the recorded seed
}

TEST_CASE("no_backward_sync refuses a model that was not set up, and is silent on one device, as Python",
          "[setup][errors]") {
  auto fabric = cpu_fabric();
  torch::nn::Linear net(3, 3);
  CHECK_THROWS_AS(fabric.no_backward_sync(*net), lf::TypeError);
  CHECK_THROWS_WITH(fabric.no_backward_sync(*net, /*enabled=*/false),
                    Contains("You need to set up the model first before you can call `fabric.no_backward_sync()`: "
                             "`model = fabric.setup(model, ...)`"));
  auto model = fabric.setup(net);
  std::ostringstream warnings;  // what rank_zero_warn prints (std::cerr)
  {
    std::streambuf* previous = std::cerr.rdbuf(warnings.rdbuf());
    lf::ScopeGuard restore([previous] { std::cerr.rdbuf(previous); });
    auto skip = fabric.no_backward_sync(model);
    auto same = fabric.no_backward_sync(*net);  // the module itself, now that it is set up
  }
  CHECK(warnings.str().find("no_backward_sync") == std::string::npos);
  auto other = cpu_fabric();
  CHECK_THROWS_AS(other.no_backward_sync(model), lf::TypeError);  // set up by another Fabric
}

TEST_CASE("no_backward_sync under ddp refuses a model that was not set up", "[setup][errors]") {
  // No process group is created: the refusal comes before the strategy.
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").devices(2).strategy("ddp"), lf::env::map_env({}));
  torch::nn::Linear net(3, 3);
  CHECK_THROWS_AS(fabric.no_backward_sync(*net), lf::TypeError);
  CHECK_THROWS_WITH(fabric.no_backward_sync(*net), Contains("You need to set up the model first"));
}

TEST_CASE("move_to_device=false leaves the module where it is", "[setup]") {
  auto fabric = cpu_fabric("64-true");
  torch::nn::Linear net(2, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(lf::SetupOptions{/*move_to_device=*/false}, net, sgd);
  CHECK(net->weight.scalar_type() == torch::kFloat64);  // precision conversion still happens
  CHECK(net->weight.device() == torch::Device(torch::kCPU));
  auto single = fabric.setup_module(lf::SetupOptions{false}, torch::nn::Linear(1, 1));
  CHECK(single->weight.scalar_type() == torch::kFloat64);
}

TEST_CASE("objects destroyed after setup do not block new ones at the same address", "[setup]") {
  auto fabric = cpu_fabric();
  for (int i = 0; i < 3; ++i) {  // each iteration's optimizer lives at the same stack address
    torch::nn::Linear net(2, 2);
    torch::optim::SGD sgd(net->parameters(), 0.1);
    CHECK_NOTHROW(fabric.setup(net, sgd));
  }
}

TEST_CASE("strategy_as returns the concrete strategy, or a TypeError naming the active one", "[fabric]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({}));
  CHECK(fabric.strategy_as<lf::SingleDeviceStrategy>().name() == "single_device");
  CHECK(&fabric.strategy_as<lf::Strategy>() == fabric.strategy().get());
  CHECK_THROWS_AS(fabric.strategy_as<lf::FSDPStrategy>(), lf::TypeError);
  CHECK_THROWS_WITH(fabric.strategy_as<lf::FSDPStrategy>(), Contains("'single_device'") && Contains("FSDPStrategy"));
}

TEST_CASE("all_reduce takes lf::ReduceOp as well as Python's strings", "[fabric]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({}));
  CHECK(fabric.all_reduce(3.0, lf::ReduceOp::Sum) == 3.0);
  CHECK(torch::equal(fabric.all_reduce(torch::ones({2}), lf::ReduceOp::Max), torch::ones({2})));
  std::vector<torch::Tensor> many{torch::ones({1}), torch::zeros({1})};
  CHECK(fabric.all_reduce(many, lf::ReduceOp::Min).size() == 2);
  CHECK_THROWS_AS(fabric.all_reduce(1.0, "median"), lf::ValueError);
}

TEST_CASE("fabric.restart_count() is the launcher's TORCHELASTIC_RESTART_COUNT, 0 without one", "[fabric]") {
  CHECK(lf::Fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({})).restart_count() == 0);
  lf::Fabric restarted(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({{"TORCHELASTIC_RESTART_COUNT", "2"}}));
  CHECK(restarted.restart_count() == 2);
}
