// What a backward pass is asked to do beyond loss.backward(): the arguments Python's
// Tensor.backward and torch.autograd.grad take, for Fabric::backward and Fabric::grad.
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace lightning::fabric {

/// Fabric::backward(loss, options): Python's loss.backward(retain_graph=, create_graph=, inputs=).
///   fabric.backward(loss, BackwardOptions().retain())              // a second backward follows
///   fabric.backward(loss, BackwardOptions().only({model->weight})) // fill these gradients only
struct LF_API BackwardOptions {
  /// Keep the graph for another backward; nullopt: create_graph's value (PyTorch's default).
  std::optional<bool> retain_graph;
  /// Build a graph of the backward itself (higher-order gradients). One process only: ddp and
  /// fsdp average gradients in place, which a graph through them cannot follow; use
  /// Fabric::grad with create_graph for a penalty term.
  bool create_graph = false;
  /// Accumulate gradients into these leaves only; empty: every leaf the loss depends on.
  std::vector<at::Tensor> inputs;

  BackwardOptions& retain(bool on = true) { retain_graph = on; return *this; }
  BackwardOptions& higher_order(bool on = true) { create_graph = on; return *this; }
  BackwardOptions& only(std::vector<at::Tensor> leaves) { inputs = std::move(leaves); return *this; }
};

/// Fabric::grad(outputs, inputs, options): torch.autograd.grad's other arguments.
struct LF_API GradOptions {
  /// One per output, as Python's grad_outputs; empty: ones for each output (scalars only).
  std::vector<at::Tensor> grad_outputs;
  /// nullopt: create_graph's value (PyTorch's default).
  std::optional<bool> retain_graph;
  /// Keep the gradient differentiable, so that a penalty built from it reaches the parameters in
  /// the next fabric.backward (WGAN-GP, R1, MAML's inner step).
  bool create_graph = false;
  /// An input the outputs do not depend on gives an undefined tensor instead of an error.
  bool allow_unused = false;

  GradOptions& outputs_grad(std::vector<at::Tensor> grads) { grad_outputs = std::move(grads); return *this; }
  GradOptions& retain(bool on = true) { retain_graph = on; return *this; }
  GradOptions& higher_order(bool on = true) { create_graph = on; return *this; }
  GradOptions& unused_allowed(bool on = true) { allow_unused = on; return *this; }
};

}  // namespace lightning::fabric
