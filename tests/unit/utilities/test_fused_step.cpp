// Fused optimizer steps (utilities/fused_step.h) against LibTorch's own step: every optimizer and
// option over 20 steps with a scheduler and two parameter groups, the operator count of one
// step, a checkpoint round trip, a loss scaler's skip, and the fallbacks.
#include <torch/torch.h>

#include <functional>
#include <map>
#include <sstream>

#include "lightning/fabric.h"
#include "lightning/fabric/utilities/fused_step.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;

namespace {
using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>,
                                                                             std::vector<torch::Tensor>)>;

// Two groups (the second at a tenth of the first's learning rate): matrices, vectors, a scalar.
struct Parameters {
  std::vector<torch::Tensor> first, second;
  Parameters() {
    torch::manual_seed(3);
    for (const auto& shape : std::vector<std::vector<int64_t>>{{5, 7}, {7}, {3, 2, 4}}) first.push_back(torch::randn(shape).requires_grad_());
    for (const auto& shape : std::vector<std::vector<int64_t>>{{4, 4}, {}}) second.push_back(torch::randn(shape).requires_grad_());
  }
  std::vector<torch::Tensor> all() const {
    auto joined = first;
    joined.insert(joined.end(), second.begin(), second.end());
    return joined;
  }
};

// The same gradients for both runs at a step; one parameter has none on odd steps (LibTorch
// then leaves it, and its step counter, alone).
void set_gradients(const Parameters& parameters, int step) {
  torch::manual_seed(100 + step);
  for (const auto& parameter : parameters.all()) parameter.mutable_grad() = torch::randn_like(parameter);
  if (step % 2 == 1) parameters.first[1].mutable_grad().reset();
}

double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

// Every state tensor of the optimizer, in parameter order, and its step counters (serialised:
// what a checkpoint stores).
std::string serialised(torch::optim::Optimizer& optimizer) {
  std::ostringstream stream;
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  archive.save_to(stream);
  return stream.str();
}

void compare_over_steps(const MakeOptimizer& make, int steps = 20) {
  Parameters reference, fused;
  auto libtorch = make(reference.first, reference.second);
  auto ours = make(fused.first, fused.second);
  torch::optim::StepLR libtorch_schedule(*libtorch, /*step_size=*/5, /*gamma=*/0.5);
  torch::optim::StepLR our_schedule(*ours, 5, 0.5);
  REQUIRE_FALSE(lf::why_not_fused(*ours));
  for (int step = 0; step < steps; ++step) {
    set_gradients(reference, step);
    set_gradients(fused, step);
    libtorch->step();
    REQUIRE(lf::fused_step(*ours));
    libtorch_schedule.step();
    our_schedule.step();
  }
  INFO("max |fused - LibTorch| after " << steps << " steps: " << max_difference(fused.all(), reference.all()));
  CHECK(max_difference(fused.all(), reference.all()) <= 1e-6);
  // The state has LibTorch's layout: the same keys, types and counters, values within rounding.
  REQUIRE(ours->state().size() == libtorch->state().size());
  auto reloaded = make(fused.first, fused.second);
  std::istringstream stream(serialised(*ours));
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  reloaded->load(archive);  // LibTorch's own loader accepts what fused steps left
  CHECK(reloaded->state().size() == libtorch->state().size());
}

template <class Optimizer, class Options>
MakeOptimizer two_groups(Options options) {
  return [options](std::vector<torch::Tensor> first, std::vector<torch::Tensor> second) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(first, std::make_unique<Options>(options));
    auto slower = std::make_unique<Options>(options);
    slower->lr(options.lr() / 10);
    groups.emplace_back(second, std::move(slower));
    return std::make_unique<Optimizer>(std::move(groups), options);
  };
}
}  // namespace

TEST_CASE("fused Adam matches LibTorch's over 20 steps", "[fused]") {
  using torch::optim::Adam;
  using torch::optim::AdamOptions;
  SECTION("defaults") { compare_over_steps(two_groups<Adam>(AdamOptions(1e-2))); }
  SECTION("weight decay") { compare_over_steps(two_groups<Adam>(AdamOptions(1e-2).weight_decay(0.1))); }
  SECTION("amsgrad, other betas and eps") {
    compare_over_steps(two_groups<Adam>(AdamOptions(1e-2).amsgrad(true).betas({0.8, 0.99}).eps(1e-6)));
  }
}

TEST_CASE("fused AdamW matches LibTorch's over 20 steps", "[fused]") {
  using torch::optim::AdamW;
  using torch::optim::AdamWOptions;
  SECTION("defaults (weight decay 1e-2)") { compare_over_steps(two_groups<AdamW>(AdamWOptions(1e-2))); }
  SECTION("amsgrad, strong decay") {
    compare_over_steps(two_groups<AdamW>(AdamWOptions(1e-2).amsgrad(true).weight_decay(0.3)));
  }
  SECTION("no decay") { compare_over_steps(two_groups<AdamW>(AdamWOptions(1e-2).weight_decay(0))); }
}

TEST_CASE("fused SGD matches LibTorch's over 20 steps", "[fused]") {
  using torch::optim::SGD;
  using torch::optim::SGDOptions;
  SECTION("plain") { compare_over_steps(two_groups<SGD>(SGDOptions(0.1))); }
  SECTION("momentum") { compare_over_steps(two_groups<SGD>(SGDOptions(0.1).momentum(0.9))); }
  SECTION("momentum, dampening, weight decay") {
    compare_over_steps(two_groups<SGD>(SGDOptions(0.1).momentum(0.9).dampening(0.2).weight_decay(1e-3)));
  }
  SECTION("nesterov") { compare_over_steps(two_groups<SGD>(SGDOptions(0.1).momentum(0.9).nesterov(true))); }
}

TEST_CASE("fused Adagrad matches LibTorch's over 20 steps", "[fused]") {
  using torch::optim::Adagrad;
  using torch::optim::AdagradOptions;
  SECTION("defaults") { compare_over_steps(two_groups<Adagrad>(AdagradOptions(0.1))); }
  SECTION("lr decay, weight decay, initial accumulator") {
    compare_over_steps(two_groups<Adagrad>(
        AdagradOptions(0.1).lr_decay(0.01).weight_decay(0.1).initial_accumulator_value(0.1).eps(1e-8)));
  }
}

namespace {
// Top-level ATen operators issued while fn runs on this thread (nested calls not counted).
int top_level_operators(const std::function<void()>& fn) {
  static thread_local int depth = 0;
  static thread_local int count = 0;
  depth = 0;
  count = 0;
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
            if (depth++ == 0) ++count;
            return nullptr;
          },
          [](const at::RecordFunction&, at::ObserverContext*) { --depth; })
          .scopes({at::RecordScope::FUNCTION}));
  fn();
  at::removeCallback(handle);
  return count;
}
}  // namespace

TEST_CASE("a fused step issues a few operators per group, LibTorch's about nine per tensor", "[fused]") {
  Parameters parameters;
  for (int i = 0; i < 20; ++i) parameters.first.push_back(torch::randn({8}).requires_grad_());  // 23 + 2 tensors
  auto make = two_groups<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-3));
  auto libtorch = make(parameters.first, parameters.second);
  auto fused = make(parameters.first, parameters.second);
  set_gradients(parameters, 0);
  const int libtorch_ops = top_level_operators([&] { libtorch->step(); });
  const int fused_ops = top_level_operators([&] { lf::fused_step(*fused); });
  INFO("LibTorch: " << libtorch_ops << " operators, fused: " << fused_ops);
  CHECK(libtorch_ops >= 8 * 25);
  // Per group and step: the step tensor and the kernel, plus the state zeros made on the first step.
  CHECK(fused_ops - 2 * 25 <= 2 * 2);
  const int second_step = top_level_operators([&] { lf::fused_step(*fused); });
  CHECK(second_step <= 2 * 2);
}

TEST_CASE("fused steps resume bitwise from a checkpoint, also one written by LibTorch's step", "[fused][checkpoint]") {
  auto make = two_groups<torch::optim::Adam>(torch::optim::AdamOptions(1e-2).amsgrad(true));
  Parameters straight, resumed;
  auto uninterrupted = make(straight.first, straight.second);
  for (int step = 0; step < 10; ++step) {
    set_gradients(straight, step);
    lf::fused_step(*uninterrupted);
  }
  SECTION("written after fused steps") {
    auto before = make(resumed.first, resumed.second);
    for (int step = 0; step < 5; ++step) {
      set_gradients(resumed, step);
      lf::fused_step(*before);
    }
    const std::string checkpoint = serialised(*before);
    auto after = make(resumed.first, resumed.second);
    std::istringstream stream(checkpoint);
    torch::serialize::InputArchive archive;
    archive.load_from(stream);
    after->load(archive);
    for (int step = 5; step < 10; ++step) {
      set_gradients(resumed, step);
      lf::fused_step(*after);
    }
    CHECK(max_difference(straight.all(), resumed.all()) == 0.0);
  }
  SECTION("LibTorch's state after LibTorch's steps continues under fused steps") {
    auto libtorch = make(resumed.first, resumed.second);
    for (int step = 0; step < 5; ++step) {
      set_gradients(resumed, step);
      libtorch->step();
    }
    for (int step = 5; step < 10; ++step) {
      set_gradients(resumed, step);
      lf::fused_step(*libtorch);
    }
    CHECK(max_difference(straight.all(), resumed.all()) <= 1e-6);
  }
}

TEST_CASE("a loss scaler's overflow skips the fused step without a trace and a finite step unscales in the kernel",
          "[fused][scaler]") {
  for (const auto kernel : {lf::StepKernel::LibTorch, lf::StepKernel::Fused}) {
    lf::LossScaler scaler(lf::LossScalerOptions{8.0, 2.0, 0.5, 2000});
    torch::Tensor weight = torch::ones({2}, torch::requires_grad());
    torch::optim::Adam adam(std::vector<torch::Tensor>{weight}, torch::optim::AdamOptions(0.1));
    (void)scaler.scale(torch::ones({}));
    weight.mutable_grad() = torch::tensor({INFINITY, 8.0f});
    CHECK_FALSE(scaler.step(adam, kernel));
    scaler.update();
    CHECK(torch::equal(weight.detach(), torch::ones({2})));
    CHECK(adam.state().empty());  // no state was left behind by the skipped step
    CHECK(scaler.get_scale() == 4.0);
    (void)scaler.scale(torch::ones({}));
    weight.mutable_grad() = torch::tensor({4.0f, -8.0f});  // unscaled: {1, -2}
    CHECK(scaler.step(adam, kernel));
    scaler.update();
    CHECK(torch::allclose(weight.grad(), torch::tensor({1.0f, -2.0f})));
    CHECK(torch::allclose(weight.detach(), torch::tensor({0.9f, 1.1f}), 1e-6, 1e-6));  // Adam's first step: lr * sign
    CHECK(adam.state().size() == 1);
  }
}

TEST_CASE("what the fused kernels do not cover steps through LibTorch", "[fused][errors]") {
  torch::Tensor weight = torch::ones({4, 4}, torch::requires_grad());
  SECTION("another optimizer type") {
    torch::optim::RMSprop rmsprop(std::vector<torch::Tensor>{weight});
    CHECK_THAT(*lf::why_not_fused(rmsprop), Catch::Matchers::Contains("not torch::optim::Adam, AdamW, SGD or Adagrad"));
    weight.mutable_grad() = torch::ones({4, 4});
    CHECK_THROWS_WITH(lf::fused_step(rmsprop), Catch::Matchers::Contains("optimizer.step()"));
  }
  SECTION("a subclass that may change step()") {
    struct Custom : torch::optim::SGD {
      using torch::optim::SGD::SGD;
    } custom(std::vector<torch::Tensor>{weight}, torch::optim::SGDOptions(0.1));
    CHECK(lf::why_not_fused(custom).has_value());
  }
  SECTION("a sparse gradient") {
    torch::optim::SGD sgd(std::vector<torch::Tensor>{weight}, torch::optim::SGDOptions(0.1));
    CHECK_FALSE(lf::why_not_fused(sgd));
    weight.mutable_grad() = torch::ones({4, 4}).to_sparse();
    CHECK_THAT(*lf::why_not_fused(sgd), Catch::Matchers::Contains("sparse"));
  }
  SECTION("a non-contiguous parameter, an integer parameter") {
    torch::Tensor transposed = torch::ones({4, 3}).t().requires_grad_();
    torch::optim::SGD sgd(std::vector<torch::Tensor>{transposed}, torch::optim::SGDOptions(0.1));
    CHECK_THAT(*lf::why_not_fused(sgd), Catch::Matchers::Contains("not contiguous"));
  }
}

TEST_CASE("FabricOptimizer steps fused by default and FabricOptions or SetupOptions turn it off", "[fused][fabric]") {
  auto train = [](lf::FabricOptions options, lf::SetupOptions setup, bool expect_fused) {
    lf::Fabric fabric(options.accelerator("cpu"), lf::env::map_env({}));
    torch::manual_seed(0);
    torch::nn::Linear net(4, 3);
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2));
    auto [model, optimizer] = fabric.setup(setup, net, adamw);
    CHECK(optimizer.fused() == expect_fused);
    if (!expect_fused) CHECK_THAT(*optimizer.why_not_fused(), Catch::Matchers::Contains("turned off"));
    for (int step = 0; step < 3; ++step) {
      optimizer.zero_grad();
      fabric.backward(model(torch::ones({2, 4})).pow(2).sum());
      CHECK(optimizer.step());
    }
    return net->weight.detach().clone();
  };
  const auto fused = train(lf::FabricOptions(), {}, true);
  const auto off = train(lf::FabricOptions().fused_optimizer_steps(false), {}, false);
  lf::SetupOptions setup_off;
  setup_off.fuse_optimizer_steps = false;
  const auto off_here = train(lf::FabricOptions(), setup_off, false);
  lf::SetupOptions setup_on;
  setup_on.fuse_optimizer_steps = true;
  const auto on_here = train(lf::FabricOptions().fused_optimizer_steps(false), setup_on, true);
  CHECK(torch::allclose(fused, off, 1e-6, 1e-6));
  CHECK(torch::equal(off, off_here));
  CHECK(torch::equal(fused, on_here));
}

TEST_CASE("a closure runs before the fused step, with grad mode on", "[fused]") {
  torch::Tensor weight = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD sgd(std::vector<torch::Tensor>{weight}, torch::optim::SGDOptions(0.5));
  int calls = 0;
  lf::run_optimizer_step(sgd, [&] {
    ++calls;
    CHECK(torch::GradMode::is_enabled());
    weight.mutable_grad() = torch::ones({2});
    return torch::zeros({});
  }, lf::StepKernel::Fused);
  CHECK(calls == 1);
  CHECK(torch::equal(weight.detach(), torch::full({2}, 0.5f)));
}
