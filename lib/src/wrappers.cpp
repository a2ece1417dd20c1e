#include "lightning/fabric/wrappers.h"

#include <torch/types.h>

#include <atomic>
#include <set>

#include "lightning/fabric/hang/flight_recorder.h"

namespace lightning::fabric {
namespace detail {
namespace {
std::atomic<int>& backward_depth() {
  static std::atomic<int> depth{0};
  return depth;
}
}  // namespace

BackwardScope::BackwardScope() { ++backward_depth(); }
BackwardScope::~BackwardScope() { --backward_depth(); }
bool BackwardScope::active() { return backward_depth().load() > 0; }

void check_backward_through_fabric() {
  if (BackwardScope::active()) return;
  throw RuntimeError(
      "loss.backward() was called on a value computed by a FabricModule. Call fabric.backward(loss) instead: "
      "it runs backward through the strategy and precision plugin (gradient synchronisation, loss scaling), "
      "so the same loop stays correct on every device and strategy.");
}

}  // namespace detail

namespace {
void refuse_inside_captured_step(bool inside, const char* call) {
  LF_CHECK(!inside, ValueError, "FabricOptimizer::", call, " was called inside the step function of a CapturedStep, "
           "which zeroes the gradients and steps the optimizer itself (a captured graph would record a second step "
           "with a frozen step count). Remove optimizer.", call, " from the step function: it should run the forward "
           "and fabric.backward(loss) and return the loss.");
}
}  // namespace

bool FabricOptimizer::step(const torch::optim::Optimizer::LossClosure& closure) {
  refuse_inside_captured_step(inside_captured_step_, "step()");
  bool stepped = false;
  {
    RECORD_USER_SCOPE("lf::optimizer_step");
    stepped = strategy_->optimizer_step(*optimizer_, closure, fused() ? StepKernel::Fused : StepKernel::LibTorch);
  }
  after_step();
  return stepped;
}

void FabricOptimizer::after_step() {
  if (auto* recorder = flight::Recorder::process()) recorder->note_step();  // the step `lightning-run status` shows
  if (observer_) observer_->after_optimizer_step();
  if (callbacks_ == nullptr) return;
  for (const auto& callback : *callbacks_) {
    invoke_hook(*callback, "on_after_optimizer_step", HookArgs{{"strategy", strategy_.get()}, {"optimizer", optimizer_.get()}});
  }
}

std::optional<std::string> FabricOptimizer::why_not_fused() const {
  if (!fuse_steps_) {
    return std::string("fusing was turned off (FabricOptions::fused_optimizer_steps or SetupOptions::fuse_optimizer_steps)");
  }
  return lightning::fabric::why_not_fused(*optimizer_);
}

void FabricOptimizer::zero_grad(bool set_to_none) {
  refuse_inside_captured_step(inside_captured_step_, "zero_grad()");
  for (auto& group : optimizer_->param_groups()) {
    for (auto& parameter : group.params()) {
      if (!parameter.grad().defined()) continue;
      if (set_to_none) {
        parameter.mutable_grad().reset();
      } else {
        torch::NoGradGuard no_grad;
        parameter.mutable_grad().zero_();
      }
    }
  }
}

}  // namespace lightning::fabric
