#include "lightning/fabric/internal/capture_checks.h"

#include <sstream>

namespace lightning::fabric::internal {

namespace {
std::string shape_text(c10::IntArrayRef sizes) {
  std::ostringstream text;
  text << sizes;
  return text.str();
}
}  // namespace

std::vector<TensorSignature> signature_of(const std::vector<at::Tensor>& inputs) {
  std::vector<TensorSignature> signature;
  for (const auto& input : inputs) signature.push_back({input.sizes().vec(), input.scalar_type()});
  return signature;
}

std::optional<std::string> signature_mismatch(const std::vector<TensorSignature>& captured,
                                              const std::vector<at::Tensor>& inputs) {
  if (captured.size() != inputs.size()) {
    return "the step was captured with " + std::to_string(captured.size()) + " inputs, this call passes " +
           std::to_string(inputs.size()) + ". Pass the same inputs every call.";
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) return "input " + std::to_string(i) + " is an undefined tensor.";
    const auto& expected = captured[i];
    if (inputs[i].sizes() != c10::IntArrayRef(expected.sizes)) {
      return "input " + std::to_string(i) + " has shape " + shape_text(inputs[i].sizes()) + ", the step was captured with " +
             shape_text(expected.sizes) + ". A CUDA graph replays fixed shapes: pad or drop the last batch " +
             "(DataLoaderOptions::drop_last), or run steps of other shapes without CapturedStep.";
    }
    if (inputs[i].scalar_type() != expected.dtype) {
      return "input " + std::to_string(i) + " is " + c10::toString(inputs[i].scalar_type()) +
             ", the step was captured with " + c10::toString(expected.dtype) + ". Convert it first.";
    }
  }
  return std::nullopt;
}

std::string explain_capture_failure(const std::string& what) {
  return "CapturedStep: capturing the step as a CUDA graph failed. A graph records kernels only, so the step "
         "function must not read a value back to the host (.item(), .cpu(), printing a tensor, a shape or branch "
         "that depends on tensor values such as nonzero or masked_select), synchronise the device, or call "
         "optimizer.step()/zero_grad() itself. Move such work out of the step function (read the returned loss "
         "after the call instead). CUDA said: " +
         what;
}

}  // namespace lightning::fabric::internal
