// CapturedStep on the CPU: every refusal it can give before a GPU is involved, the input checks
// and the capture-failure message, and the recorded optimizer step (learning rate and step
// counters in device tensors) driven eagerly against the ordinary fused step. The capture itself
// runs in the GPU check (scripts/device-check.sh).
#include <torch/torch.h>

#include "lightning/fabric.h"
#include "lightning/fabric/internal/capture_checks.h"
#include "lightning/fabric/internal/device_fused_step.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

namespace {
lf::CapturedStep::StepFunction unused_step() {
  return [](const std::vector<torch::Tensor>&) { return torch::zeros({}); };
}

lf::FabricOptimizer fabric_optimizer(lf::Fabric& fabric, std::shared_ptr<torch::optim::Optimizer> optimizer,
                                     bool fuse = true) {
  return lf::FabricOptimizer(std::move(optimizer), fabric.strategy(), fuse);
}

std::shared_ptr<torch::optim::AdamW> adamw_over(const torch::Tensor& weight) {
  return std::make_shared<torch::optim::AdamW>(std::vector<torch::Tensor>{weight}, torch::optim::AdamWOptions(1e-2));
}
}  // namespace

TEST_CASE("CapturedStep refuses a CPU device, naming it and the fix", "[capture][errors]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({}));
  auto optimizer = fabric_optimizer(fabric, adamw_over(torch::ones({2}, torch::requires_grad())));
  REQUIRE(optimizer.fused());
  CHECK_THROWS_AS(lf::CapturedStep(fabric, optimizer, unused_step()), lf::ValueError);
  CHECK_THROWS_WITH(lf::CapturedStep(fabric, optimizer, unused_step()),
                    Contains("runs on cpu") && Contains("accelerator \"cuda\""));
}

TEST_CASE("CapturedStep refuses an optimizer step that is not fused", "[capture][errors]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({}));
  const torch::Tensor weight = torch::ones({2}, torch::requires_grad());
  auto rmsprop = fabric_optimizer(fabric, std::make_shared<torch::optim::RMSprop>(std::vector<torch::Tensor>{weight}));
  CHECK_THAT(*lf::why_not_capturable(fabric, rmsprop), Contains("needs a fused optimizer step"));
  CHECK_THAT(*lf::why_not_capturable(fabric, rmsprop), Contains("not torch::optim::Adam, AdamW, SGD or Adagrad"));
  auto turned_off = fabric_optimizer(fabric, adamw_over(weight), /*fuse=*/false);
  CHECK_THROWS_WITH(lf::CapturedStep(fabric, turned_off, unused_step()), Contains("turned off"));
}

TEST_CASE("CapturedStep refuses a loss scaler: 16-mixed decides on the host", "[capture][errors]") {
  auto scaled = std::make_shared<lf::MixedPrecision>("16-mixed", torch::kFloat16, std::make_shared<lf::LossScaler>());
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").plugin(scaled), lf::env::map_env({}));
  auto optimizer = fabric_optimizer(fabric, adamw_over(torch::ones({2}, torch::requires_grad())));
  CHECK_THROWS_WITH(lf::CapturedStep(fabric, optimizer, unused_step()),
                    Contains("loss scaler") && Contains("\"bf16-mixed\""));
}

TEST_CASE("CapturedStep refuses ddp and fsdp: their gradient hooks run on the host", "[capture][errors]") {
  for (const char* strategy : {"ddp", "fsdp"}) {
    lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").devices(2).strategy(strategy), lf::env::map_env({}));
    auto optimizer = fabric_optimizer(fabric, adamw_over(torch::ones({2}, torch::requires_grad())));
    CHECK_THROWS_WITH(lf::CapturedStep(fabric, optimizer, unused_step()),
                      Contains(std::string("strategy \"") + strategy + "\"") && Contains("host-side hooks"));
  }
}

TEST_CASE("CapturedStep refuses an empty step function and no warm-up", "[capture][errors]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({}));
  auto optimizer = fabric_optimizer(fabric, adamw_over(torch::ones({2}, torch::requires_grad())));
  CHECK_THROWS_WITH(lf::CapturedStep(fabric, optimizer, nullptr), Contains("step function is empty"));
  lf::CaptureOptions no_warmup;
  no_warmup.warmup_steps = 0;
  CHECK_THROWS_WITH(lf::CapturedStep(fabric, optimizer, unused_step(), no_warmup), Contains("warmup_steps=0"));
}

TEST_CASE("a captured step's inputs keep the captured count, shapes and dtypes", "[capture][errors]") {
  namespace internal = lf::internal;
  const auto captured = internal::signature_of({torch::zeros({8, 16}), torch::zeros({8}, torch::kLong)});
  CHECK_FALSE(internal::signature_mismatch(captured, {torch::ones({8, 16}), torch::ones({8}, torch::kLong)}));
  CHECK_THAT(*internal::signature_mismatch(captured, {torch::ones({8, 16})}), Contains("captured with 2 inputs"));
  CHECK_THAT(*internal::signature_mismatch(captured, {torch::ones({5, 16}), torch::ones({8}, torch::kLong)}),
             Contains("input 0 has shape [5, 16]") && Contains("captured with [8, 16]") && Contains("drop_last"));
  CHECK_THAT(*internal::signature_mismatch(captured, {torch::ones({8, 16}), torch::ones({8})}),
             Contains("input 1 is Float") && Contains("captured with Long"));
}

TEST_CASE("a failed capture says what a graph cannot record and keeps CUDA's message", "[capture][errors]") {
  const std::string message =
      lf::internal::explain_capture_failure("operation not permitted when stream is capturing");
  CHECK_THAT(message, Contains(".item()") && Contains("read the returned loss after the call") &&
                          Contains("CUDA said: operation not permitted when stream is capturing"));
}

TEST_CASE("the recorded optimizer step, run eagerly, follows the fused step with a scheduler", "[capture][fused]") {
  for (const std::string kind : {"adamw", "sgd", "adagrad"}) {
    INFO(kind);
    torch::manual_seed(0);
    std::vector<torch::Tensor> eager{torch::randn({4, 3}).requires_grad_(), torch::randn({5}).requires_grad_()};
    std::vector<torch::Tensor> recorded;
    for (const auto& t : eager) recorded.push_back(t.detach().clone().requires_grad_());
    auto make = [&](const std::vector<torch::Tensor>& parameters) -> std::unique_ptr<torch::optim::Optimizer> {
      if (kind == "adamw") return std::make_unique<torch::optim::AdamW>(parameters, torch::optim::AdamWOptions(1e-2));
      if (kind == "sgd") return std::make_unique<torch::optim::SGD>(parameters, torch::optim::SGDOptions(0.1).momentum(0.9));
      return std::make_unique<torch::optim::Adagrad>(parameters, torch::optim::AdagradOptions(0.1));
    };
    auto eager_optimizer = make(eager);
    auto recorded_optimizer = make(recorded);
    torch::optim::StepLR eager_schedule(*eager_optimizer, 2, 0.5);
    torch::optim::StepLR recorded_schedule(*recorded_optimizer, 2, 0.5);
    auto set_gradients = [](const std::vector<torch::Tensor>& parameters, int step) {
      torch::manual_seed(50 + step);
      for (const auto& p : parameters) p.mutable_grad() = torch::randn_like(p);
    };
    // One warm-up step as CapturedStep takes it, then the "replays".
    set_gradients(eager, 0);
    set_gradients(recorded, 0);
    lf::fused_step(*eager_optimizer);
    lf::fused_step(*recorded_optimizer);
    lf::internal::DeviceStepInputs inputs;
    lf::internal::prepare_device_step(*recorded_optimizer, inputs);
    for (int step = 1; step < 8; ++step) {
      set_gradients(eager, step);
      set_gradients(recorded, step);
      lf::fused_step(*eager_optimizer);
      if (step > 1) lf::internal::prepare_device_step(*recorded_optimizer, inputs);  // refreshes the learning rate
      lf::internal::queue_device_step(*recorded_optimizer, inputs);
      for (const auto& advance : inputs.advance_host_counters) advance();
      eager_schedule.step();
      recorded_schedule.step();
    }
    for (size_t i = 0; i < eager.size(); ++i) CHECK(torch::allclose(eager[i], recorded[i], 1e-6, 1e-6));
    // The host counters advanced with every replay, as LibTorch's own step would have.
    if (kind == "adamw") {
      for (const auto& p : recorded) {
        CHECK(static_cast<torch::optim::AdamWParamState&>(*recorded_optimizer->state().at(p.unsafeGetTensorImpl())).step() == 8);
      }
    }
  }
}

TEST_CASE("the recorded step refuses a parameter whose first gradient came after the warm-up", "[capture][errors]") {
  torch::Tensor warmed = torch::ones({2}, torch::requires_grad());
  torch::Tensor late = torch::ones({3}, torch::requires_grad());
  torch::optim::AdamW adamw(std::vector<torch::Tensor>{warmed, late}, torch::optim::AdamWOptions(1e-2));
  warmed.mutable_grad() = torch::ones({2});
  lf::fused_step(adamw);
  lf::internal::DeviceStepInputs inputs;
  lf::internal::prepare_device_step(adamw, inputs);
  late.mutable_grad() = torch::ones({3});
  CHECK_THROWS_WITH(lf::internal::queue_device_step(adamw, inputs), Contains("first gradient after the warm-up steps"));
}

TEST_CASE("the recorded step refuses parameters whose warm-up step counts differ", "[capture][errors]") {
  torch::Tensor always = torch::ones({2}, torch::requires_grad());
  torch::Tensor sometimes = torch::ones({2}, torch::requires_grad());
  torch::optim::Adam adam(std::vector<torch::Tensor>{always, sometimes}, torch::optim::AdamOptions(1e-2));
  always.mutable_grad() = torch::ones({2});
  lf::fused_step(adam);  // only `always` steps
  sometimes.mutable_grad() = torch::ones({2});
  lf::fused_step(adam);
  lf::internal::DeviceStepInputs inputs;
  CHECK_THROWS_WITH(lf::internal::prepare_device_step(adam, inputs),
                    Contains("different step counts (2 and 1)") && Contains("missed a gradient"));
}
