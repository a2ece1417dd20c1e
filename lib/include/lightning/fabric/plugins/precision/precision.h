// Precision plugins: how a module's parameters, inputs and outputs are typed and how backward and
// the optimizer step run. The base class is full precision ("32-true"); subclasses override only
// what differs. Registry names and aliases are resolved by the Connector.
#pragma once

#include "lightning/fabric/export.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <optional>
#include <string>

#include "lightning/fabric/backward_options.h"
#include "lightning/fabric/plugins/plugin.h"
#include "lightning/fabric/plugins/precision/loss_scaler.h"
#include "lightning/fabric/registry.h"
#include "lightning/fabric/utilities/fused_step.h"
#include "lightning/fabric/utilities/scope_guard.h"

namespace lightning::fabric {

class LF_API Precision : public Plugin {
 public:
  std::string name() const override { return "32-true"; }

  /// The dtype parameters are converted to by setup(); nullopt keeps the module's own (float32).
  virtual std::optional<c10::ScalarType> module_dtype() const { return std::nullopt; }
  /// Converts the module's floating parameters and buffers (called once by Fabric::setup).
  virtual void convert_module(torch::nn::Module& module) const;
  /// Casts a floating input tensor for the forward; other tensors pass unchanged.
  virtual at::Tensor convert_input(const at::Tensor& input) const;
  /// Casts a floating output tensor back to what the user's loop expects.
  virtual at::Tensor convert_output(const at::Tensor& output) const { return output; }

  /// Active around the module's forward (autocast for the mixed plugins).
  virtual ScopeGuard forward_context() const { return ScopeGuard(); }
  /// The kind of device the module computes on; the Connector sets it from the accelerator before
  /// any forward (Python passes it to MixedPrecision's constructor). Default: nothing to do.
  virtual void set_device_type(c10::DeviceType type) { (void)type; }
  /// Active inside Fabric::init_tensor(): new floating tensors get the precision's dtype.
  virtual ScopeGuard tensor_init_context() const;
  /// Active inside Fabric::init_module(): tensor_init_context by default.
  virtual ScopeGuard module_init_context() const { return tensor_init_context(); }

  /// Backward in three steps; the default runs loss.backward() with the options' arguments.
  virtual void pre_backward(at::Tensor& loss) const { (void)loss; }
  virtual void backward(at::Tensor& loss, const BackwardOptions& options) const;
  virtual void post_backward(at::Tensor& loss) const { (void)loss; }
  /// Runs the optimizer's step with the given kernel (run_optimizer_step; a loss scaler may skip
  /// it); returns false when skipped. FabricOptimizer chooses the kernel.
  virtual bool optimizer_step(torch::optim::Optimizer& optimizer,
                              const torch::optim::Optimizer::LossClosure& closure = nullptr,
                              StepKernel kernel = StepKernel::LibTorch) const;
  /// Brings gradients to their true scale before clipping (no-op without a loss scaler).
  virtual void unscale_gradients(torch::optim::Optimizer& optimizer) const { (void)optimizer; }
  /// The loss scaler whose state checkpoints save and restore; null for precisions without one.
  virtual std::shared_ptr<LossScaler> loss_scaler() const { return nullptr; }
};

/// "64-true", "16-true", "bf16-true": parameters, inputs, new tensors (inside init_tensor(),
/// init_module() and the forward) in one dtype; floating outputs come back in float32, the
/// default dtype, as Python Fabric returns them.
class LF_API TruePrecision : public Precision {
 public:
  TruePrecision(std::string name, c10::ScalarType dtype) : name_(std::move(name)), dtype_(dtype) {}
  std::string name() const override { return name_; }
  std::optional<c10::ScalarType> module_dtype() const override { return dtype_; }
  at::Tensor convert_output(const at::Tensor& output) const override;
  ScopeGuard forward_context() const override { return tensor_init_context(); }

 private:
  std::string name_;
  c10::ScalarType dtype_;
};

/// "64-true".
class LF_API DoublePrecision : public TruePrecision {
 public:
  DoublePrecision() : TruePrecision("64-true", torch::kFloat64) {}
};

/// "bf16-mixed" and "16-mixed": parameters stay float32; the forward runs under LibTorch's
/// autocast in the low dtype, on the device type in use only (CPU autocast stays off while a CUDA
/// model runs, and CUDA's while a CPU model runs); inputs are cast to it and floating outputs come
/// back in float32. ("16-mixed" on a CPU accelerator becomes "bf16-mixed", as in Python Fabric.)
/// With a loss scaler ("16-mixed" gets one by default), backward scales the loss and the optimizer
/// step unscales, skips steps with inf/NaN gradients and updates the scale.
class LF_API MixedPrecision : public Precision {
 public:
  MixedPrecision(std::string name, c10::ScalarType dtype, std::shared_ptr<LossScaler> scaler = nullptr);
  std::string name() const override { return name_; }
  at::Tensor convert_input(const at::Tensor& input) const override;
  at::Tensor convert_output(const at::Tensor& output) const override;
  ScopeGuard forward_context() const override;
  void set_device_type(c10::DeviceType type) override { device_type_ = type; }
  c10::DeviceType device_type() const { return device_type_; }
  c10::ScalarType autocast_dtype() const { return dtype_; }

  void pre_backward(at::Tensor& loss) const override;
  bool optimizer_step(torch::optim::Optimizer& optimizer,
                      const torch::optim::Optimizer::LossClosure& closure = nullptr,
                      StepKernel kernel = StepKernel::LibTorch) const override;
  void unscale_gradients(torch::optim::Optimizer& optimizer) const override;
  std::shared_ptr<LossScaler> loss_scaler() const override { return scaler_; }

 private:
  std::string name_;
  c10::ScalarType dtype_;
  std::shared_ptr<LossScaler> scaler_;
  c10::DeviceType device_type_ = c10::DeviceType::CPU;  // autocast's device: set_device_type
};

using PrecisionRegistry = Registry<Precision>;
/// The process-wide precision registry, filled with the built-in plugins on first use
/// (src/builtin_registrations.cpp).
LF_API PrecisionRegistry& precision_registry();

/// Every precision string the Connector accepts: the registry's names in order, then the short
/// spellings Python accepts ("64", "32", "16", "bf16"), which the Connector maps to them.
LF_API std::vector<std::string> precision_choices();

}  // namespace lightning::fabric
