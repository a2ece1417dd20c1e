// The machinery behind FabricOptions::detect_nonfinite (utilities/nonfinite.h): a RecordFunction
// observer of set-up modules' forwards, and the check fabric.backward runs after each backward.
#pragma once

#include <ATen/record_function.h>
#include <torch/nn/module.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "lightning/fabric/utilities/scope_guard.h"

namespace lightning::fabric {
class Fabric;

namespace internal {

/// A set-up module's trained tensors by name (its parameters; under fsdp this rank's shards).
using NamedGradients = std::vector<std::pair<std::string, at::Tensor>>;

class NonFiniteWatch {
 public:
  /// Becomes the process's watch (RuntimeError while another Fabric's is); the destructor steps down.
  NonFiniteWatch();
  ~NonFiniteWatch();
  NonFiniteWatch(const NonFiniteWatch&) = delete;
  NonFiniteWatch& operator=(const NonFiniteWatch&) = delete;
  /// The process's watch, or null when detection is off.
  static NonFiniteWatch* active();

  /// Observes the operations run until the guard ends (nested calls: the outermost counts).
  ScopeGuard observe(torch::nn::Module& module);

  /// Before a backward: forgets gradients seen outside fabric.backward.
  void before_backward();
  /// After a backward: gathers every rank's first non-finite forward output, loss and gradients (a
  /// collective) and throws NonFiniteError on every rank when any rank found one. A rank's own
  /// gradients are probed as the backward produces them, before any reduction, so the rank where a
  /// non-finite gradient began is named, not the ranks it reached through the reduction.
  /// check_gradients: false under a loss scaler. gradients: the reduced ones, in registration order
  /// (checked last first), for what the reduction itself made non-finite.
  void after_backward(Fabric& fabric, const at::Tensor& loss, const NamedGradients& gradients, bool check_gradients);

  // RecordFunction's callbacks (static: they find the watch through active()).
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn);
  static void on_end(const at::RecordFunction& fn, at::ObserverContext* context);

 private:
  struct Event {
    at::Tensor bad;      // 0-dim double on the output's device: its sum (non-finite when an element is)
    std::string op;      // e.g. aten::addmm
    std::string module;  // "module 'fc2'", "after module 'fc2'", or the inputs
  };
  struct GradientEvent {
    at::Tensor bad;         // as Event::bad, of one gradient as the backward produced it
    std::string parameter;  // its qualified name, e.g. "blocks.0.fc1.weight"
  };
  // Hooks every parameter of module that needs a gradient and is not hooked yet: the hook probes
  // the gradient before it is accumulated (and so before ddp's and fsdp's reductions).
  void hook_gradients(torch::nn::Module& module);
  void record_gradient(const std::string& parameter, const at::Tensor& gradient);
  // Past kMaxEvents: keeps the first -inf-only and the first NaN/+inf event, drops the rest.
  void keep_first_nonfinite_events();
  std::string local_finding(const at::Tensor& loss, const NamedGradients& gradients, bool check_gradients,
                            bool& origin);

  std::unordered_map<const c10::TensorImpl*, std::string> labels_;  // parameters (and their casts) -> module name
  std::string last_module_;
  std::vector<Event> events_;
  std::mutex gradients_mutex_;  // the backward may run on autograd's device threads
  std::vector<GradientEvent> gradient_events_;
  std::unordered_map<const c10::TensorImpl*, c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> hooked_;
  at::CallbackHandle handle_ = 0;
  int depth_ = 0;
  int64_t step_ = 0;
};

}  // namespace internal
}  // namespace lightning::fabric
