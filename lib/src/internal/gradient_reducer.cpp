#include "lightning/fabric/internal/gradient_reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <set>

namespace lightning::fabric::internal {

struct GradientReducer::State : std::enable_shared_from_this<GradientReducer::State> {
  struct Bucket {
    std::vector<size_t> parameters;  // indices into State::parameters
    size_t pending = 0;
    at::Tensor flat;
    std::function<void()> wait;
  };

  std::vector<at::Tensor> parameters;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keeps the hooks alive
  std::vector<size_t> bucket_of;
  std::vector<bool> excluded;  // by the current backward's inputs: reduced as zeros, never written
  std::vector<Bucket> buckets;
  std::shared_ptr<Collective> collective;
  std::mutex mutex;
  bool armed = false;
  bool finishing_queued = false;
  size_t next_to_start = 0;

  void mark_ready(size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!armed) return;
    if (!finishing_queued) {
      finishing_queued = true;
      auto self = shared_from_this();
      torch::autograd::Engine::get_default_engine().queue_callback([self] { self->finish(); });
    }
    Bucket& bucket = buckets[bucket_of[index]];
    if (bucket.pending > 0) --bucket.pending;
    while (next_to_start < buckets.size() && buckets[next_to_start].pending == 0) start(buckets[next_to_start++]);
  }

  // Copies the bucket's gradients into its flat buffer (allocated once: a fresh multi-MiB buffer
  // per step costs page faults) and starts the all-reduce.
  void start(Bucket& bucket) {
    at::NoGradGuard no_grad;
    if (!bucket.flat.defined()) {
      int64_t total = 0;
      for (size_t index : bucket.parameters) total += parameters[index].numel();
      bucket.flat = at::empty({total}, parameters[bucket.parameters.front()].options().requires_grad(false));
    }
    int64_t offset = 0;
    for (size_t index : bucket.parameters) {
      const at::Tensor& parameter = parameters[index];
      at::Tensor slot = bucket.flat.narrow(0, offset, parameter.numel());
      const at::Tensor& grad = parameter.grad();
      if (grad.defined() && !excluded[index]) {
        slot.copy_(grad.reshape({-1}));
      } else {
        slot.zero_();
      }
      offset += parameter.numel();
    }
    bucket.wait = collective->all_reduce_start_(bucket.flat);
  }

  // End of backward (autograd engine callback): start the rest, wait, average, copy back.
  void finish() {
    std::lock_guard<std::mutex> lock(mutex);
    at::NoGradGuard no_grad;
    while (next_to_start < buckets.size()) start(buckets[next_to_start++]);
    const double world = static_cast<double>(collective->world_size());
    for (auto& bucket : buckets) {
      bucket.wait();
      bucket.flat.div_(world);
      int64_t offset = 0;
      for (size_t index : bucket.parameters) {
        at::Tensor& parameter = parameters[index];
        if (excluded[index]) {
          offset += parameter.numel();
          continue;
        }
        if (!parameter.grad().defined()) parameter.mutable_grad() = at::zeros_like(parameter);
        at::Tensor grad = parameter.mutable_grad();
        grad.copy_(bucket.flat.narrow(0, offset, grad.numel()).view_as(grad));
        offset += grad.numel();
      }
      bucket.wait = nullptr;
    }
    finishing_queued = false;
    armed = false;
  }
};

namespace {
struct ReadyHook : torch::autograd::FunctionPostHook {
  ReadyHook(std::weak_ptr<GradientReducer::State> state, size_t index) : state(std::move(state)), index(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto alive = state.lock()) alive->mark_ready(index);
    return outputs;
  }
  std::weak_ptr<GradientReducer::State> state;
  size_t index;
};
}  // namespace

GradientReducer::GradientReducer(const std::shared_ptr<torch::nn::Module>& module, std::shared_ptr<Collective> collective,
                                 double first_bucket_mb, double bucket_mb)
    : state_(std::make_shared<State>()), module_(module), raw_module_(module.get()) {
  State& state = *state_;
  state.collective = std::move(collective);
  for (const auto& parameter : module->parameters()) {
    if (parameter.requires_grad()) state.parameters.push_back(parameter);
  }
  // Buckets in reverse parameter order, one dtype and device each. As c10d does, a parameter joins
  // the open bucket and the bucket closes once it holds at least its cap, so a large parameter
  // shares the first bucket and its all-reduce overlaps with the rest of backward.
  state.bucket_of.assign(state.parameters.size(), 0);
  int64_t filled = 0;
  bool open = false;
  for (size_t k = state.parameters.size(); k-- > 0;) {
    const at::Tensor& parameter = state.parameters[k];
    if (open) {
      const at::Tensor& first = state.parameters[state.buckets.back().parameters.front()];
      open = first.scalar_type() == parameter.scalar_type() && first.device() == parameter.device();
    }
    if (!open) {
      state.buckets.emplace_back();
      filled = 0;
      open = true;
    }
    state.buckets.back().parameters.push_back(k);
    state.bucket_of[k] = state.buckets.size() - 1;
    filled += parameter.numel() * static_cast<int64_t>(parameter.element_size());
    const double cap_mb = state.buckets.size() == 1 ? first_bucket_mb : bucket_mb;
    if (filled >= static_cast<int64_t>(cap_mb * 1024 * 1024)) open = false;
  }
  for (size_t k = 0; k < state.parameters.size(); ++k) {
    auto accumulator = torch::autograd::impl::grad_accumulator(state.parameters[k]);
    accumulator->add_post_hook(std::make_unique<ReadyHook>(state_, k));
    state.accumulators.push_back(std::move(accumulator));
  }
}

size_t GradientReducer::bucket_count() const { return state_->buckets.size(); }

void GradientReducer::arm(const std::vector<at::Tensor>& only) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& state = *state_;
  state.excluded.assign(state.parameters.size(), false);
  for (auto& bucket : state.buckets) bucket.pending = bucket.parameters.size();
  if (!only.empty()) {
    std::set<const c10::TensorImpl*> chosen;
    for (const auto& tensor : only) chosen.insert(tensor.unsafeGetTensorImpl());
    for (size_t k = 0; k < state.parameters.size(); ++k) {
      if (chosen.count(state.parameters[k].unsafeGetTensorImpl()) > 0) continue;
      state.excluded[k] = true;  // no gradient will arrive: ready from the start
      --state.buckets[state.bucket_of[k]].pending;
    }
  }
  state.armed = true;
  state.finishing_queued = false;
  state.next_to_start = 0;
}

void GradientReducer::disarm() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->armed = false;
}

}  // namespace lightning::fabric::internal
