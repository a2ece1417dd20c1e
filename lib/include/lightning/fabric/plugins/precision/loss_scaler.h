// Dynamic loss scaling for float16 mixed precision ("16-mixed"), with PyTorch GradScaler's
// semantics: the loss is multiplied by the scale before backward; before the
// optimizer steps, gradients are divided by it and checked for inf/NaN; a step with a non-finite
// gradient is skipped and the scale multiplied by backoff_factor; after growth_interval clean steps
// in a row the scale is multiplied by growth_factor.
//
// Gradients on every device go through ATen's fused AMP kernels (_amp_foreach_non_finite_check_and_
// unscale_, _amp_update_scale_), which LibTorch 2.x has for CPU and CUDA. Not thread-safe: one training loop
// drives it. Owned by the MixedPrecision plugin; Fabric calls scale/unscale/step/update for you.
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <unordered_map>

#include "lightning/fabric/checkpoint/stateful.h"
#include "lightning/fabric/utilities/fused_step.h"

namespace lightning::fabric {

struct LF_API LossScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

/// Stateful: put it into an lf::State to checkpoint it.
class LF_API LossScaler : public Stateful {
 public:
  /// Throws ValueError for growth_factor <= 1, backoff_factor outside (0, 1), init_scale <= 0 or
  /// growth_interval < 1.
  explicit LossScaler(LossScalerOptions options = {});

  /// loss * scale (the scale lives on the loss's device from the first call on).
  at::Tensor scale(const at::Tensor& loss);

  /// Divides the optimizer's gradients by the scale in place and records whether any is inf/NaN.
  /// At most once per optimizer between update() calls (RuntimeError otherwise); float16
  /// gradients are refused (their unscaled values would underflow). Gradients present although no
  /// loss went through scale() since the last update() are a RuntimeError: their backward bypassed
  /// fabric.backward(loss), and dividing them by the scale would silently shrink the step.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// Steps the optimizer if every gradient is finite; returns whether it stepped. Once per
  /// optimizer between update()s. StepKernel::LibTorch unscales (unless unscale_ already did) and
  /// reads the inf/NaN flag before stepping. StepKernel::Fused gives the scale and the flag to the
  /// fused kernels, as PyTorch's GradScaler does for fused optimizers: gradients are checked
  /// without being rewritten, unscaled inside the kernel, the kernel skips on the device, and
  /// the flag is read once, after the kernels are queued.
  bool step(torch::optim::Optimizer& optimizer, StepKernel kernel = StepKernel::LibTorch);

  /// Adjusts the scale from the steps since the last update (backoff if any optimizer saw inf/NaN,
  /// growth after growth_interval clean updates) and forgets the per-optimizer state.
  void update();

  /// Combines the inf/NaN flag of unscale_ across processes that hold different gradients (a
  /// sharded strategy installs a MAX all-reduce, so all ranks skip or step together). The reducer
  /// is collective: unscale_ then runs on every rank in the same order.
  void set_found_inf_reducer(std::function<void(at::Tensor& found_inf)> reducer) { found_inf_reducer_ = std::move(reducer); }

  double get_scale() const;
  int64_t growth_tracker() const;
  const LossScalerOptions& options() const { return options_; }

  /// {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}, the keys
  /// and value types of PyTorch's GradScaler.state_dict().
  StateDict state_dict() const override;
  /// Restores a state_dict(); ValueError naming a missing or mistyped key.
  void load_state_dict(const StateDict& state) override;

 private:
  enum class Stage { kReady, kChecked, kUnscaled, kStepped };  // kChecked: flag computed, gradients still scaled
  struct OptimizerState {
    Stage stage = Stage::kReady;
    at::Tensor found_inf;  // float32 scalar, 1 if a gradient was inf/NaN
  };
  void ensure_tensors(const at::Device& device);
  // unscale_'s work: checks every gradient for inf/NaN, dividing by the scale when unscale is true.
  void check_gradients(torch::optim::Optimizer& optimizer, bool unscale);

  LossScalerOptions options_;
  at::Tensor scale_;           // float32 scalar
  at::Tensor growth_tracker_;  // int32 scalar: clean steps since the last change
  std::unordered_map<const torch::optim::Optimizer*, OptimizerState> per_optimizer_;
  bool scaled_since_update_ = false;
  std::function<void(at::Tensor&)> found_inf_reducer_;
};

}  // namespace lightning::fabric
