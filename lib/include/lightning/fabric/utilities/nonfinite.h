// Finding where a step's first non-finite value (inf or NaN) came from:
//   lf::Fabric fabric(lf::FabricOptions().detect_nonfinite(true));   // or lightning-run --detect-nonfinite
// While on, every operation that runs inside a set-up module's forward (with gradients enabled)
// has its floating-point outputs checked, on the device, without a synchronisation; each
// fabric.backward then (a collective, every rank calls it anyway):
//   1. before the backward: when some rank saw a non-finite output or loss, throws NonFiniteError
//      on every rank naming the ranks, the step, the first operation whose output was non-finite
//      and the module it belongs to (the one whose parameters it, or the last operation before it
//      that used parameters, read);
//   2. after the backward (not under a loss scaler, whose skipped steps are its own business):
//      when a set-up module's gradient is non-finite, names the parameters, the first one in
//      backward order (the last registered) first.
// LibTorch modules have no forward hooks, so operations are observed through ATen's
// RecordFunction and attributed to modules by their parameters. It costs much more than 5 % of a
// step (docs/benchmarks.md), so it is off by default: a debugging switch, as Python's
// detect_anomaly. One Fabric per process turns it on at a time.
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
  /// The ranks where it appeared first (their forward or loss); empty for gradients only.
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
