#include "lightning/fabric/strategies/strategy.h"


#include <torch/types.h>

#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/internal/gradient_norm.h"
#include "lightning/fabric/utilities/meta_init.h"
#include "lightning/fabric/utilities/rank_zero.h"

namespace lightning::fabric {

void Strategy::setup_environment() { context_.accelerator->setup_device(root_device()); }

ScopeGuard Strategy::no_backward_sync(const torch::nn::Module& module, bool enabled) {
  (void)module;
  static bool warned = false;
  if (enabled && !warned) {
    warned = true;
    rank_zero_warn("fabric.no_backward_sync() has no effect with strategy '" + name() +
                   "': it has no gradient synchronisation to skip.");
  }
  return ScopeGuard();
}

void Strategy::module_to_device(torch::nn::Module& module) const { module.to(root_device()); }

void Strategy::materialize_meta_tensors(torch::nn::Module& module) { materialize_module(module); }

void Strategy::backward(at::Tensor& loss, torch::nn::Module* module) {
  (void)module;
  const Precision& precision = *context_.precision;
  precision.pre_backward(loss);
  precision.backward(loss);
  precision.post_backward(loss);
}

bool Strategy::optimizer_step(torch::optim::Optimizer& optimizer,
                              const torch::optim::Optimizer::LossClosure& closure, StepKernel kernel) {
  return context_.precision->optimizer_step(optimizer, closure, kernel);
}

SingleDeviceStrategy::SingleDeviceStrategy(StrategyContext context) : Strategy(std::move(context)) {
  LF_CHECK(context_.parallel_devices.size() == 1, ValueError, "strategy=\"single_device\" runs one process on one ",
           "device, but ", context_.parallel_devices.size(), " devices were selected. Use devices=1, or a ",
           "distributed strategy such as \"ddp\".");
}

namespace {
// The reason action failed, or "" when it succeeded; every exception type is handled alike.
std::string failure_of(const std::function<void()>& action) {
  std::string failure;
  try {
    action();
    return failure;
  } catch (const c10::Error& error) {
    failure = error.what_without_backtrace();
  } catch (const std::exception& error) {
    failure = error.what();
  } catch (...) {
    failure = "an exception that is not a std::exception";
  }
  return failure.empty() ? "an exception without a message" : failure;
}
}  // namespace

void Strategy::run_on_rank_zero(const std::string& call, const std::function<void()>& action) {
  std::string failure = is_global_zero() ? failure_of(action) : std::string();
  failure = broadcast_bytes(failure, 0);
  LF_CHECK(failure.empty(), RuntimeError, call, " failed on rank 0: ", failure);
}

void Strategy::run_on_every_rank(const std::string& call, const std::function<void()>& action) {
  std::string failure = failure_of(action);
  const double mine = failure.empty() ? world_size() : global_rank();
  const int first = static_cast<int>(
      all_reduce(torch::full({1}, mine, torch::TensorOptions().dtype(torch::kFloat64)), ReduceOp::Min).item<double>());
  if (first >= world_size()) return;
  failure = broadcast_bytes(failure, first);
  throw RuntimeError(call + " failed on rank " + std::to_string(first) + ": " + failure);
}

void Strategy::save_checkpoint(const std::filesystem::path& path, const State& state, const StateFilter& filter) {
  run_on_rank_zero("fabric.save(" + path.string() + ")", [&] {
    save_state_dict_file(path, to_checkpoint(state, filter));
    LF_CHECK(std::filesystem::exists(path), RuntimeError, "the file is missing after writing it");
  });
}

StateDict Strategy::load_checkpoint(const std::filesystem::path& path, State* state, bool strict) {
  StateDict checkpoint = load_state_dict_file(path);
  return state ? restore_from_checkpoint(*state, checkpoint, strict) : checkpoint;
}

double Strategy::clip_gradients_by_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                                        bool error_if_nonfinite) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads = internal::gradients_of(parameters);
  if (grads.empty()) return 0.0;
  const at::Tensor part = internal::local_norm_part(grads, norm_type, grads.front().device());
  return internal::clip_to_max_norm(grads, part, norm_type, max_norm, error_if_nonfinite);
}

const std::vector<torch::Device>& Strategy::data_parallel_devices() const {
  static const std::vector<torch::Device> none;
  return none;
}

}  // namespace lightning::fabric
