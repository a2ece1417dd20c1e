#include "lightning/fabric/captured_step.h"

#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <torch/types.h>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/fabric.h"
#include "lightning/fabric/internal/capture_checks.h"
#include "lightning/fabric/internal/device_fused_step.h"
#include "lightning/fabric/strategies/parallel.h"
#include "lightning/fabric/utilities/scope_guard.h"

#ifdef LF_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace lightning::fabric {

std::optional<std::string> why_not_capturable(const Fabric& fabric, const FabricOptimizer& optimizer) {
  if (auto why = optimizer.why_not_fused()) {
    return "the step needs a fused optimizer step (its kernels read the learning rate and step counters from "
           "device tensors, which a replay updates), but this optimizer's is LibTorch's: " + *why + ".";
  }
  if (fabric.precision()->loss_scaler()) {
    return "precision \"" + fabric.precision()->name() +
           "\" has a loss scaler, which decides on the host whether each step runs; a graph cannot. Use "
           "\"bf16-mixed\" or \"32-true\".";
  }
  if (dynamic_cast<const ParallelStrategy*>(fabric.strategy().get()) || fabric.world_size() > 1 ||
      fabric.strategy()->data_parallel_devices().size() > 1) {
    return "strategy \"" + fabric.strategy()->name() +
           "\" synchronises gradients from host-side hooks, which a graph does not replay. Capture runs on one "
           "device (strategy \"auto\" or \"single_device\").";
  }
  if (!fabric.device().is_cuda()) {
    return "CUDA graphs record GPU kernels, and this Fabric runs on " + fabric.device().str() +
           ". Run the step as usual there, or choose accelerator \"cuda\".";
  }
#ifndef LF_TORCH_HAS_CUDA
  return std::string("this build of lightning_fabric has no CUDA LibTorch.");
#else
  return std::nullopt;
#endif
}

#ifdef LF_TORCH_HAS_CUDA
struct CapturedStep::Graph {
  at::cuda::CUDAGraph graph;
  std::vector<internal::TensorSignature> signature;
  std::vector<at::Tensor> inputs;  // the captured buffers each call copies into
  at::Tensor loss;                 // written by every replay
  internal::DeviceStepInputs device_step;
  std::vector<const void*> fingerprint;  // parameter storage and state objects at capture
  int calls = 0;
  bool captured = false;
};
#else
struct CapturedStep::Graph {};
#endif

CapturedStep::CapturedStep(Fabric& fabric, FabricOptimizer& optimizer, StepFunction step, CaptureOptions options)
    : fabric_(fabric), optimizer_(optimizer), step_(std::move(step)), options_(options) {
  LF_CHECK(step_ != nullptr, ValueError, "CapturedStep: the step function is empty; pass one that runs the forward "
           "and fabric.backward(loss) and returns the loss.");
  LF_CHECK(options_.warmup_steps >= 1, ValueError, "CapturedStep: CaptureOptions::warmup_steps=", options_.warmup_steps,
           " must be at least 1: the optimizer's state must exist before the capture (default 3).");
  if (auto why = why_not_capturable(fabric_, optimizer_)) throw ValueError("CapturedStep: " + *why);
  graph_ = std::make_unique<Graph>();
}

CapturedStep::~CapturedStep() = default;

#ifdef LF_TORCH_HAS_CUDA
namespace {
// What a replay depends on staying put: every parameter's storage and every state object.
std::vector<const void*> fingerprint_of(torch::optim::Optimizer& optimizer) {
  std::vector<const void*> fingerprint;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) {
      fingerprint.push_back(parameter.data_ptr());
      const auto found = optimizer.state().find(parameter.unsafeGetTensorImpl());
      fingerprint.push_back(found == optimizer.state().end() ? nullptr : found->second.get());
    }
  }
  return fingerprint;
}

// Runs fn on a side stream that first waits for the current one; the current stream then waits for
// it (what capture and its warm-up need: work off the default stream, ordered with it).
template <class Fn>
void on_side_stream(Fn&& fn) {
  const auto current = c10::cuda::getCurrentCUDAStream();
  const auto side = c10::cuda::getStreamFromPool();
  at::cuda::CUDAEvent ready;
  ready.record(current);
  ready.block(side);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    fn();
  }
  at::cuda::CUDAEvent done;
  done.record(side);
  done.block(current);
}
}  // namespace
#endif

at::Tensor CapturedStep::operator()(const std::vector<at::Tensor>& inputs) {
#ifndef LF_TORCH_HAS_CUDA
  (void)inputs;
  throw RuntimeError("CapturedStep: this build of lightning_fabric has no CUDA LibTorch.");
#else
  Graph& g = *graph_;
  torch::optim::Optimizer& optimizer = optimizer_.optimizer();
  if (g.calls == 0) {
    g.signature = internal::signature_of(inputs);
    for (const auto& input : inputs) {
      LF_CHECK(input.defined(), ValueError, "CapturedStep: an input is an undefined tensor.");
      g.inputs.push_back(torch::empty_like(input, input.options().device(fabric_.device())));
    }
  } else if (auto mismatch = internal::signature_mismatch(g.signature, inputs)) {
    throw ValueError("CapturedStep: " + *mismatch);
  }
  for (size_t i = 0; i < inputs.size(); ++i) g.inputs[i].copy_(inputs[i], /*non_blocking=*/true);
  ++g.calls;
  if (g.calls <= options_.warmup_steps) {
    on_side_stream([&] {
      optimizer_.zero_grad();
      g.loss = run_user_step(g.inputs);
      optimizer_.step();
    });
    return g.loss;
  }
  if (!g.captured) {
    optimizer_.zero_grad();  // gradients are made inside the graph's memory, then stay there
    internal::prepare_device_step(optimizer, g.device_step);
    g.fingerprint = fingerprint_of(optimizer);
    on_side_stream([&] {
      const bool cache_was_on = at::autocast::is_autocast_cache_enabled();
      at::autocast::set_autocast_cache_enabled(false);  // cached casts would outlive the capture
      ScopeGuard restore([cache_was_on] { at::autocast::set_autocast_cache_enabled(cache_was_on); });
      g.graph.capture_begin();
      try {
        g.loss = run_user_step(g.inputs);
        internal::queue_device_step(optimizer, g.device_step);
      } catch (const std::exception& error) {
        try {
          g.graph.capture_end();
        } catch (...) {  // the capture is invalid already; reset below
        }
        g.graph.reset();
        throw RuntimeError(internal::explain_capture_failure(error.what()));
      }
      g.graph.capture_end();
    });
    g.captured = true;
  } else {
    LF_CHECK(fingerprint_of(optimizer) == g.fingerprint, RuntimeError,
             "CapturedStep: the optimizer's parameters or state were replaced after the capture (a checkpoint load, "
             "load_state_dict, a new parameter group), so the graph would update memory nobody reads. Build a new "
             "CapturedStep after loading.");
    internal::prepare_device_step(optimizer, g.device_step);  // this replay's learning rates
  }
  {
    RECORD_USER_SCOPE("lf::captured_step");
    g.graph.replay();
  }
  for (const auto& advance : g.device_step.advance_host_counters) advance();
  optimizer_.after_step();  // replays are steps: the profiler counts them, callbacks see them
  return g.loss;
#endif
}

namespace {
// One exact integer sum of each tensor's bits, stacked: any in-place change of a value changes its
// sum (short of changes that cancel exactly). Used in the eager warm-up runs only, never on replay.
at::Tensor bit_sums(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> sums;
  sums.reserve(tensors.size());
  for (const auto& t : tensors) {
    const auto same_width = t.element_size() == 1   ? at::kByte
                            : t.element_size() == 2 ? at::kShort
                            : t.element_size() == 4 ? at::kInt
                                                    : at::kLong;
    const at::Tensor bits = t.element_size() > 8 ? t.detach().contiguous().view(at::kLong) : t.detach().view(same_width);
    sums.push_back(bits.sum(at::kLong));
  }
  return at::stack(sums);
}
}  // namespace

at::Tensor CapturedStep::run_user_step(const std::vector<at::Tensor>& inputs) {
  // The optimizer refuses step() and zero_grad() meanwhile. A parameter changed in place by other
  // means is found by its version counter, and in the eager warm-up runs (at least one precedes
  // every capture) by its bits too: LibTorch's SGD::step writes through p.data(), which no version
  // counter sees.
  std::vector<at::Tensor> parameters;
  std::vector<uint32_t> versions;
  for (const auto& group : optimizer_.optimizer().param_groups()) {
    for (const auto& parameter : group.params()) {
      parameters.push_back(parameter);
      versions.push_back(parameter._version());
    }
  }
  bool eager = true;
#ifdef LF_TORCH_HAS_CUDA
  eager = c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
#endif
  const at::Tensor sums_before = eager && !parameters.empty() ? bit_sums(parameters) : at::Tensor();
  optimizer_.inside_captured_step_ = true;
  ScopeGuard leave([this] { optimizer_.inside_captured_step_ = false; });
  at::Tensor loss = step_(inputs);
  int64_t changed = -1;
  for (size_t i = 0; i < parameters.size() && changed < 0; ++i) {
    if (parameters[i]._version() != versions[i]) changed = static_cast<int64_t>(i);
  }
  if (changed < 0 && sums_before.defined()) {
    const at::Tensor differs = sums_before.ne(bit_sums(parameters)).nonzero();
    if (differs.numel() > 0) changed = differs[0][0].item<int64_t>();
  }
  LF_CHECK(changed < 0, ValueError, "CapturedStep: the step function changed an optimizer parameter in place "
           "(parameter ", changed, " of the optimizer), as optimizer->step() does. CapturedStep steps the optimizer "
           "itself after the step function: the step function should run the forward and fabric.backward(loss) and "
           "return the loss.");
  return loss;
}

bool CapturedStep::captured() const {
#ifdef LF_TORCH_HAS_CUDA
  return graph_->captured;
#else
  return false;
#endif
}

}  // namespace lightning::fabric
