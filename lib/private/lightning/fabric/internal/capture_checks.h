// The checks of a captured step that need no GPU (CapturedStep, captured_step.cpp): the inputs'
// shapes and dtypes against the captured ones, and what a failed capture means.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

namespace lightning::fabric::internal {

/// What a captured graph fixes about one input.
struct TensorSignature {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype;
};

std::vector<TensorSignature> signature_of(const std::vector<at::Tensor>& inputs);

/// Which input differs from the captured ones (count, shape or dtype), with both values and the
/// fix, as a sentence; nullopt when they match.
std::optional<std::string> signature_mismatch(const std::vector<TensorSignature>& captured,
                                              const std::vector<at::Tensor>& inputs);

/// The error a failed capture reports: the likely causes and fixes, then the CUDA message `what`.
std::string explain_capture_failure(const std::string& what);

}  // namespace lightning::fabric::internal
