#include "lightning/fabric/strategies/strategy.h"


#include <torch/types.h>

#include <cmath>
#include <optional>

#include "lightning/fabric/checkpoint/background_write.h"
#include "lightning/fabric/checkpoint/checkpoint_peers.h"
#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/checkpoint/placement.h"
#include "lightning/fabric/checkpoint/sharded_checkpoint.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/internal/gradient_norm.h"
#include "lightning/fabric/checkpoint/checkpoint_storage.h"
#include "lightning/fabric/storage/object_store.h"
#include "lightning/fabric/utilities/meta_init.h"
#include "lightning/fabric/utilities/rank_zero.h"

namespace lightning::fabric {

Strategy::Strategy(StrategyContext context) : context_(std::move(context)) {}

Strategy::~Strategy() {
  if (background_write_) abandon_background_save();
}

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

void Strategy::backward(at::Tensor& loss, torch::nn::Module* module, const BackwardOptions& options) {
  (void)module;
  const Precision& precision = *context_.precision;
  precision.pre_backward(loss);
  precision.backward(loss, options);
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
// The strategy's ranks, reached through its own collectives (one process included).
CheckpointPeers peers_of(Strategy& strategy) {
  return CheckpointPeers(
      strategy.global_rank(), strategy.world_size(),
      [&strategy](const std::string& bytes, int src) { return strategy.broadcast_bytes(bytes, src); },
      [&strategy](int value) {
        const at::Tensor mine = torch::full({1}, static_cast<double>(value), torch::TensorOptions().dtype(torch::kFloat64));
        return static_cast<int>(strategy.all_reduce(mine, ReduceOp::Min).item<double>());
      });
}
}  // namespace

void Strategy::run_on_rank_zero(const std::string& call, const std::function<void()>& action) {
  peers_of(*this).run_on_rank_zero(call, action);
}

void Strategy::run_on_every_rank(const std::string& call, const std::function<void()>& action) {
  peers_of(*this).run_on_every_rank(call, action);
}

void Strategy::save_checkpoint(const std::filesystem::path& path, const State& state, const StateFilter& filter,
                               bool in_background) {
  settle_background_save(/*wait=*/true);
  const std::string call = std::string(in_background ? "fabric.save_in_background(" : "fabric.save(") + path.string() + ")";
  std::optional<HostCopyScope> host_copies;  // device tensors copied once, into pinned memory kept for the next
  ScopeGuard copy_finished;
  if (in_background) {
    if (!host_buffers_) host_buffers_ = std::make_unique<HostBufferPool>();
    host_buffers_->start_copy();
    host_copies.emplace(*host_buffers_);
    copy_finished = ScopeGuard([this] { host_buffers_->finish_copy(); });
  }
  CheckpointWrite steps = prepare_checkpoint(call, path, state, filter, in_background);
  copy_finished = ScopeGuard();
  host_copies.reset();
  if (!in_background) {
    std::exception_ptr error;
    try {
      if (steps.write) steps.write();
    } catch (...) {
      error = std::current_exception();
    }
    finish_checkpoint(call, steps, error);
    return;
  }
  background_steps_ = CheckpointWrite{nullptr, std::move(steps.commit), std::move(steps.discard)};
  background_write_ = std::make_unique<BackgroundWrite>(call, steps.write ? std::move(steps.write) : [] {});
}

void Strategy::settle_background_save(bool wait) {
  if (!background_write_) return;
  if (!wait) {
    const double mine = background_write_->finished() ? 1.0 : 0.0;
    const double everyone =
        world_size() > 1 ? all_reduce(torch::full({1}, mine, torch::dtype(torch::kFloat64)), ReduceOp::Min).item<double>()
                         : mine;
    if (everyone < 1.0) return;
  }
  const std::unique_ptr<BackgroundWrite> finished = std::move(background_write_);
  CheckpointWrite steps = std::move(background_steps_);
  background_steps_ = {};
  finish_checkpoint(finished->call(), steps, finished->wait());
}

void Strategy::abandon_background_save() {
  if (!background_write_) return;
  const std::unique_ptr<BackgroundWrite> abandoned = std::move(background_write_);
  abandoned->wait();
  if (background_steps_.discard) background_steps_.discard();
  background_steps_ = {};
}

void Strategy::finish_checkpoint(const std::string& call, CheckpointWrite& steps, std::exception_ptr write_error) {
  try {
    run_on_every_rank(call, [&] {
      if (write_error) std::rethrow_exception(write_error);
    });
    if (steps.commit) steps.commit();
  } catch (...) {
    if (steps.discard) steps.discard();
    throw;
  }
}

CheckpointWrite Strategy::prepare_checkpoint(const std::string& call, const std::filesystem::path& path,
                                             const State& state, const StateFilter& filter, bool host_copy) {
  StateDict checkpoint = make_state_dict();
  run_on_every_rank(call, [&] {
    if (!is_global_zero()) return;
    checkpoint = to_checkpoint(state, filter);
    if (host_copy) checkpoint = lightning::fabric::host_copy(checkpoint).toGenericDict();
  });
  if (!is_global_zero()) return {};
  return {[path, checkpoint] {
            save_state_dict_file(path, checkpoint);
            LF_CHECK(storage::is_object_url(path.string()) || std::filesystem::exists(path), RuntimeError,
                     "the file is missing after writing it");
          },
          nullptr, nullptr};
}

StateDict Strategy::load_checkpoint(const std::filesystem::path& path, State* state, bool strict) {
  StateDict checkpoint = checkpoint_storage::read_checkpoint(  // s3://: downloaded first
      path, "fabric.load(" + path.string() + ")", [](const std::filesystem::path& local) { return load_state_dict_file(local); });
  return state ? restore_from_checkpoint(*state, checkpoint, strict) : checkpoint;
}

std::vector<std::pair<std::string, at::Tensor>> Strategy::trained_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) tensors.emplace_back(item.key(), item.value());
  return tensors;
}

std::vector<Strategy::TrainedPart> Strategy::trained_parts(const torch::nn::Module& module) {
  CheckpointLayout* layout = placements();
  LF_CHECK(layout == nullptr || layout->every_rank_holds_every_tensor(), ValueError, "trained_parts (which lf::EMA "
           "averages by): strategy '", name(), "' keeps each pipeline stage's parameters on that stage's ranks only, "
           "so no rank can give every parameter's full value for the average and its checkpoint. Use lf::EMA with "
           "single_device, dp, ddp, fsdp or model_parallel.");
  std::vector<TrainedPart> parts;
  for (const auto& [name, tensor] : trained_tensors(module)) {
    const std::optional<Placement> placement = layout != nullptr ? layout->placement(tensor) : std::nullopt;
    if (!placement) {
      TrainedPart part{name, tensor.sizes().vec(), tensor, nullptr, nullptr};
      part.gather = [](const at::Tensor& values) { return values.clone(); };
      part.cut = [](const at::Tensor& full) { return full; };
      parts.push_back(std::move(part));
      continue;
    }
    TrainedPart part{name, placement->global_shape, tensor, nullptr, nullptr};
    // Every part once: its writer places it in zeros, and the world's sum is the whole value
    // (exact: each element is one value plus zeros).
    part.gather = [this, placement = *placement](const at::Tensor& values) {
      at::Tensor whole = at::zeros(placement.global_shape, values.options());
      if (placement.writes) place_into_whole(whole, placement, values.reshape(placement.local_shape()));
      return all_reduce(whole, ReduceOp::Sum);
    };
    part.cut = [placement = *placement, shape = tensor.sizes().vec(), name = name](const at::Tensor& full) {
      return part_of_whole(full, placement, "trained_parts: parameter '" + name + "'").view(shape);
    };
    parts.push_back(std::move(part));
  }
  return parts;
}

double Strategy::clip_gradients_by_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                                        bool error_if_nonfinite) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads = internal::gradients_of(parameters);
  CheckpointLayout* layout = placements();
  if (layout == nullptr) {  // every rank holds every gradient whole
    if (grads.empty()) return 0.0;
    const at::Tensor part = internal::local_norm_part(grads, norm_type, grads.front().device());
    return internal::clip_to_max_norm(grads, part, norm_type, max_norm, error_if_nonfinite);
  }
  // Every element once: the parts the ranks write are distinct and make up their tensors, so
  // their norm parts are reduced over the world (sum over sharded dimensions, once over
  // replicated ones); a tensor without a placement is equal on every rank and counted here. Every
  // rank reduces, whatever it holds, so none waits alone.
  std::vector<at::Tensor> written, replicated;
  for (const at::Tensor& tensor : parameters) {
    const std::optional<Placement> placement = layout->placement(tensor);
    if (!placement) {
      replicated.push_back(tensor);
    } else if (placement->writes) {
      written.push_back(tensor);
    }
  }
  const at::Device device = root_device();
  const bool max = std::isinf(norm_type);
  at::Tensor part = internal::local_norm_part(internal::gradients_of(written), norm_type, device);
  if (world_size() > 1) part = all_reduce(part, max ? ReduceOp::Max : ReduceOp::Sum);
  const at::Tensor own = internal::local_norm_part(internal::gradients_of(replicated), norm_type, device);
  return internal::clip_to_max_norm(grads, max ? at::maximum(part, own) : part + own, norm_type, max_norm,
                                    error_if_nonfinite);
}

const std::vector<torch::Device>& Strategy::data_parallel_devices() const {
  static const std::vector<torch::Device> none;
  return none;
}

}  // namespace lightning::fabric
