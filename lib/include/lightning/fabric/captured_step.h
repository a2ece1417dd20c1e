// EXPERIMENTAL: a training step captured once as a CUDA graph and replayed (forward, backward
// and the fused optimizer step), for static-shape training on one CUDA device. Replaying removes
// the CPU's per-kernel launch cost; Python users get this only through torch.compile's
// "reduce-overhead" mode. Experimental until the GPU check has run it (docs/performance.md).
//
//   lf::CapturedStep step(fabric, optimizer, [&](const std::vector<torch::Tensor>& in) {
//     auto loss = torch::nn::functional::cross_entropy(model(in[0]), in[1]);
//     fabric.backward(loss);
//     return loss;
//   });
//   for (auto& [x, y] : batches) torch::Tensor loss = step({x, y});   // one optimizer step per call
//
// The first CaptureOptions::warmup_steps calls run eagerly (they create the optimizer state and
// warm up the libraries); the next one captures and replays; later calls copy their inputs into
// the captured buffers and replay. The learning rate is read from each parameter group before
// every replay, so a scheduler keeps working; the optimizer's host step counters advance with
// every replay, so optimizer->state() and checkpoints stay right.
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lightning::fabric {

class Fabric;
class FabricOptimizer;

struct LF_API CaptureOptions {
  /// Eager calls before the capture (at least 1: the optimizer state must exist first).
  int warmup_steps = 3;
};

/// Why a step of fabric and optimizer cannot be captured, naming the cause and what to do; nullopt
/// when it can. Checked in this order: the optimizer step must be fused (the recorded kernels read
/// the learning rate and step counters from device tensors); no loss scaler (16-mixed decides
/// on the host whether a step runs); a single-device strategy (ddp and fsdp synchronise gradients
/// from host-side hooks); a CUDA device in a CUDA build.
LF_API std::optional<std::string> why_not_capturable(const Fabric& fabric, const FabricOptimizer& optimizer);

class LF_API CapturedStep {
 public:
  /// The user's step: forward and fabric.backward(loss) on the inputs, returning the loss. It must
  /// not call optimizer.step() or zero_grad() (CapturedStep does both: either call, or a parameter
  /// changed in place, is a ValueError at the first call), nor read values back to
  /// the host (.item(), printing a tensor, data-dependent shapes): a graph cannot record that.
  using StepFunction = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

  /// Refuses (ValueError, before anything runs) what why_not_capturable names, an empty step
  /// function and warmup_steps < 1. fabric and optimizer must outlive this object.
  CapturedStep(Fabric& fabric, FabricOptimizer& optimizer, StepFunction step, CaptureOptions options = {});
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  /// One training step on inputs (any device: they are copied into the captured buffers). Every call
  /// must pass as many tensors, of the same shapes and dtypes, as the first (ValueError naming the
  /// input otherwise). Returns the loss, a tensor the next call overwrites: clone it to keep it.
  /// RuntimeError when the capture fails (the step read a value back to the host, for example)
  /// or when the optimizer's state or parameters were replaced after the capture (a load).
  at::Tensor operator()(const std::vector<at::Tensor>& inputs);

  /// Whether the step has been captured (calls after the warm-up replay it).
  bool captured() const;

 private:
  struct Graph;  // the CUDA graph and its buffers (CUDA types stay out of this header)
  /// step_(inputs) with the optimizer's step() and zero_grad() refused; ValueError when it changed
  /// a parameter in place.
  at::Tensor run_user_step(const std::vector<at::Tensor>& inputs);
  Fabric& fabric_;
  FabricOptimizer& optimizer_;
  StepFunction step_;
  CaptureOptions options_;
  std::unique_ptr<Graph> graph_;
};

}  // namespace lightning::fabric
