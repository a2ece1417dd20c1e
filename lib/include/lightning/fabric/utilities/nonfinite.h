// Finding where a step's first non-finite value (inf or NaN) came from:
//   lf::Fabric fabric(lf::FabricOptions().detect_nonfinite(true));
// While on, every operation that runs inside a set-up module's forward (with gradients enabled)
// has its floating-point outputs summed on the device, without a synchronisation; after each
// fabric.backward (a collective, every rank calls it anyway):
//   1. when some rank's loss is not finite: that rank's first forward output that held NaN or
//      +inf (else one with -inf only) is named, with the operation and the module it belongs to
//      (the one whose parameters it, or the last operation before it that used parameters, read);
//      with none, the loss itself is named;
//   2. else (not under a loss scaler, whose skipped steps are its own business): the first
//      gradient that rank's backward produced non-finite, before the gradient reduction (ddp's
//      all-reduce, fsdp's reduce-scatter), named by the parameter's qualified name and its module;
//      the ranks that only received it through the reduction are listed as its echo; where every
//      rank produced finite gradients and the reduction overflowed, the reduced ones are named;
// and NonFiniteError is thrown on every rank alike. Forward outputs with -inf (attention masks)
// or NaN that the loss does not see are no finding.
// LibTorch modules have no forward hooks, so operations are observed through ATen's
// RecordFunction and attributed to modules by their parameters. It costs more than 5 % of a step
// (docs/benchmarks.md), so it is off by default: a debugging switch, as Python's detect_anomaly.
// One Fabric per process turns it on at a time. Not for CapturedStep (it reads values each step).
#pragma once

#include "lightning/fabric/export.h"

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/utilities/scope_guard.h"

namespace lightning::fabric {

/// Thrown by fabric.backward on every rank when detection is on and a non-finite value appeared.
class LF_API NonFiniteError : public RuntimeError {
 public:
  NonFiniteError(const std::string& message, int64_t step, std::vector<int> ranks)
      : RuntimeError(message), step_(step), ranks_(std::move(ranks)) {}
  /// fabric.backward calls before the one that found it (the optimizer step, in a plain loop).
  int64_t step() const { return step_; }
  /// The ranks where it appeared first (their forward, loss or own gradients); empty when only the
  /// reduced gradients are non-finite (the reduction itself overflowed).
  const std::vector<int>& ranks() const { return ranks_; }

 private:
  int64_t step_;
  std::vector<int> ranks_;
};

namespace detail {
/// Observes the operations of a set-up module's forward while detection is on (a no-op guard
/// otherwise). FabricModule calls it around every forward and call.
LF_API ScopeGuard watch_forward_for_nonfinite(torch::nn::Module& module);
}  // namespace detail

}  // namespace lightning::fabric
