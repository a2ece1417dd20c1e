// Optimizer steps through ATen's fused kernels (at::_fused_adam_, _fused_adamw_, _fused_sgd_,
// _fused_adagrad_): one kernel call per (parameter group, device, dtype) instead of LibTorch's
// eight to ten operations per parameter tensor. The arithmetic is LibTorch's (the same update
// rule, within float rounding) and so is the state: the same OptimizerParamState types, keys and
// fields, so optimizer->state(), checkpoints and Python interop see no difference.
//
// Covered: torch::optim::Adam, AdamW and SGD with every option LibTorch has, on CPU and CUDA, and
// Adagrad on CPU (PyTorch fuses Adagrad on CPU only), for dense, contiguous floating-point
// parameters and gradients. Anything else (another
// optimizer type, a sparse or non-contiguous gradient, a device other than CPU/CUDA) is reported
// by why_not_fused and steps through LibTorch. FabricOptimizer::step uses this by default
// (FabricOptions::fused_optimizer_steps, SetupOptions::fuse_optimizer_steps turn it off).
#pragma once

#include "lightning/fabric/export.h"

#include <torch/optim/optimizer.h>

#include <optional>
#include <string>

namespace lightning::fabric {

/// Which code runs an optimizer's update.
enum class StepKernel {
  LibTorch,  // the optimizer's own step(closure)
  Fused,     // fused_step (the closure, if any, runs first, with grad mode on)
};

/// Why fused_step cannot run this optimizer's next step (type, option, parameter or gradient),
/// as one sentence; nullopt when it can. Reads host-side metadata only (no device sync).
LF_API std::optional<std::string> why_not_fused(const torch::optim::Optimizer& optimizer);

/// A loss scaler's inputs to a fused step ("16-mixed"). grad_scale (float32 scalar on the
/// gradients' device): gradients are divided by it inside the kernel and stored unscaled;
/// undefined when they are unscaled already. found_inf (float32 scalar): when non-zero the
/// kernels leave parameters, gradients and state untouched.
struct LF_API FusedStepScaling {
  at::Tensor grad_scale;
  at::Tensor found_inf;
};

/// One step of optimizer through the fused kernels; precondition: why_not_fused(optimizer) is
/// nullopt (ValueError otherwise). State is created as LibTorch's step creates it and step counters
/// advance on the host. Returns false when scaling.found_inf was non-zero: it is read once, after
/// every kernel is queued (the only device sync), and the step leaves no trace. Not collective.
LF_API bool fused_step(torch::optim::Optimizer& optimizer, const FusedStepScaling& scaling = {});

/// The step every Fabric optimizer step ends in: optimizer.step(closure) for StepKernel::LibTorch;
/// for StepKernel::Fused, closure() (if given) with grad mode on, then fused_step.
LF_API void run_optimizer_step(torch::optim::Optimizer& optimizer,
                               const torch::optim::Optimizer::LossClosure& closure, StepKernel kernel);

}  // namespace lightning::fabric
