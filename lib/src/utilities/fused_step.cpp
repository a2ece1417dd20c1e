#include "lightning/fabric/utilities/fused_step.h"

#include <ATen/ops/_fused_adagrad.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <typeinfo>
#include <vector>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/internal/device_fused_step.h"

namespace lightning::fabric {

namespace {
using torch::optim::Optimizer;
using torch::optim::OptimizerParamGroup;
using torch::optim::OptimizerParamState;

enum class Kind { Adam, AdamW, Sgd, Adagrad };

// Exact types only: a subclass may override step() with other arithmetic.
std::optional<Kind> kind_of(const Optimizer& optimizer) {
  const std::type_info& type = typeid(optimizer);
  if (type == typeid(torch::optim::Adam)) return Kind::Adam;
  if (type == typeid(torch::optim::AdamW)) return Kind::AdamW;
  if (type == typeid(torch::optim::SGD)) return Kind::Sgd;
  if (type == typeid(torch::optim::Adagrad)) return Kind::Adagrad;
  return std::nullopt;
}

std::optional<std::string> why_not_tensor(const at::Tensor& parameter) {
  const auto type = parameter.device().type();
  if (type != c10::DeviceType::CPU && type != c10::DeviceType::CUDA) {
    return "a parameter is on " + parameter.device().str() + "; the fused kernels run on cpu and cuda";
  }
  if (!parameter.is_floating_point()) {
    return std::string("a parameter is ") + c10::toString(parameter.scalar_type()) +
           "; the fused kernels take floating-point parameters";
  }
  if (parameter.layout() != c10::kStrided || !parameter.is_contiguous()) return std::string("a parameter is not contiguous");
  const at::Tensor& grad = parameter.grad();
  if (!grad.defined()) return std::nullopt;
  if (grad.layout() != c10::kStrided) return std::string("a gradient is sparse");
  if (grad.scalar_type() != parameter.scalar_type() || grad.device() != parameter.device()) {
    return std::string("a gradient's dtype or device differs from its parameter's");
  }
  if (!grad.is_contiguous()) return std::string("a gradient is not contiguous");
  return std::nullopt;
}

// Parameters with a gradient that share one kernel call, with their state tensors in the
// kernel's argument order.
struct Bucket {
  std::vector<at::Tensor> params, grads, first, second, third;
  int64_t step = 0;                          // the counters' value before this step
  bool first_step = false;                   // SGD: momentum buffers are new
};
// (device, dtype, counter value or SGD's first-step flag): one kernel call each.
using BucketKey = std::tuple<std::string, int, int64_t>;

at::Tensor zeros_like_parameter(const at::Tensor& parameter) {
  return torch::zeros_like(parameter, at::MemoryFormat::Preserve);
}

// Kernels take contiguous state; one loaded from elsewhere is made so, in place in the state.
const at::Tensor& contiguous(at::Tensor& tensor) {
  if (!tensor.is_contiguous()) tensor = tensor.contiguous();
  return tensor;
}

std::optional<at::Tensor> on_device(const at::Tensor& tensor, const at::Device& device) {
  if (!tensor.defined()) return std::nullopt;
  return tensor.device() == device ? tensor : tensor.to(device);
}

// One fused step over every parameter group. Eager (device_ null): step tensors are made from the
// host counters, which advance once the step is known to have run. Recorded (device_ set): the
// learning rates and step tensors come from the prepared DeviceStepInputs and nothing is made.
class FusedRun {
 public:
  FusedRun(Optimizer& optimizer, const FusedStepScaling& scaling, internal::DeviceStepInputs* device = nullptr)
      : optimizer_(optimizer), scaling_(scaling), device_(device) {}

  // Queues every kernel; eager runs then read found_inf (if any) and advance or undo. Returns stepped.
  bool run(Kind kind) {
    for (auto& group : optimizer_.param_groups()) {
      switch (kind) {
        case Kind::Adam: adam_group<torch::optim::AdamOptions, torch::optim::AdamParamState>(group, false); break;
        case Kind::AdamW: adam_group<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(group, true); break;
        case Kind::Sgd: sgd_group(group); break;
        case Kind::Adagrad: adagrad_group(group); break;
      }
      ++group_index_;
    }
    if (device_) {
      device_->advance_host_counters = std::move(advanced_);
      return true;
    }
    const bool stepped = !scaling_.found_inf.defined() || scaling_.found_inf.item<float>() == 0.0f;
    if (stepped) {
      for (const auto& advance : advanced_) advance();
    } else {
      for (void* key : created_) optimizer_.state().erase(key);
    }
    return stepped;
  }

 private:
  template <class Options, class State>
  void adam_group(OptimizerParamGroup& group, bool decoupled) {
    const auto& options = static_cast<const Options&>(group.options());
    std::map<BucketKey, Bucket> buckets;
    for (const auto& parameter : group.params()) {
      if (!parameter.grad().defined()) continue;
      State& state = state_of<State>(parameter, [&] {
        auto made = std::make_unique<State>();
        made->exp_avg(zeros_like_parameter(parameter));
        made->exp_avg_sq(zeros_like_parameter(parameter));
        return made;
      });
      if (options.amsgrad() && !state.max_exp_avg_sq().defined()) state.max_exp_avg_sq(zeros_like_parameter(parameter));
      Bucket& bucket = bucket_for(buckets, parameter, counter_key(state.step()));
      bucket.first.push_back(contiguous(state.exp_avg()));
      bucket.second.push_back(contiguous(state.exp_avg_sq()));
      if (options.amsgrad()) bucket.third.push_back(contiguous(state.max_exp_avg_sq()));
      bucket.step = state.step();
      advance_after_step(state);
    }
    const double beta1 = std::get<0>(options.betas()), beta2 = std::get<1>(options.betas());
    launch_each(buckets, options.lr(), /*counted=*/true, [&](const Bucket& bucket, const auto& steps, const auto& lr,
                                                             const auto& grad_scale, const auto& found_inf) {
      if (decoupled) {
        at::_fused_adamw_(bucket.params, bucket.grads, bucket.first, bucket.second, bucket.third, steps, lr, beta1, beta2,
                          options.weight_decay(), options.eps(), options.amsgrad(), /*maximize=*/false, grad_scale,
                          found_inf);
      } else {
        at::_fused_adam_(bucket.params, bucket.grads, bucket.first, bucket.second, bucket.third, steps, lr, beta1, beta2,
                         options.weight_decay(), options.eps(), options.amsgrad(), /*maximize=*/false, grad_scale,
                         found_inf);
      }
    });
  }

  void sgd_group(OptimizerParamGroup& group) {
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    const bool momentum = options.momentum() != 0;
    std::map<BucketKey, Bucket> buckets;
    for (const auto& parameter : group.params()) {
      if (!parameter.grad().defined()) continue;
      if (!momentum) {
        bucket_for(buckets, parameter, 0);
        continue;
      }
      const size_t created_before = created_.size();
      auto& state = state_of<torch::optim::SGDParamState>(parameter, [&] {
        auto made = std::make_unique<torch::optim::SGDParamState>();
        made->momentum_buffer(torch::empty_like(parameter.grad()));  // the kernel copies the gradient in
        return made;
      });
      const bool first_step = created_.size() != created_before;
      Bucket& bucket = bucket_for(buckets, parameter, first_step ? 1 : 0);
      bucket.first.push_back(contiguous(state.momentum_buffer()));
      bucket.first_step = first_step;
    }
    launch_each(buckets, options.lr(), /*counted=*/false, [&](const Bucket& bucket, const auto&, const auto& lr,
                                                              const auto& grad_scale, const auto& found_inf) {
      at::_fused_sgd_(bucket.params, bucket.grads, bucket.first, options.weight_decay(), options.momentum(), lr,
                      options.dampening(), options.nesterov(), /*maximize=*/false, bucket.first_step, grad_scale,
                      found_inf);
    });
  }

  void adagrad_group(OptimizerParamGroup& group) {
    const auto& options = static_cast<const torch::optim::AdagradOptions&>(group.options());
    std::map<BucketKey, Bucket> buckets;
    for (const auto& parameter : group.params()) {
      if (!parameter.grad().defined()) continue;
      // LibTorch's Adagrad makes every state in its constructor; a parameter group added later gets
      // the same initial state here.
      auto& state = state_of<torch::optim::AdagradParamState>(parameter, [&] {
        auto made = std::make_unique<torch::optim::AdagradParamState>();
        made->sum(torch::full_like(parameter, options.initial_accumulator_value(), at::MemoryFormat::Preserve));
        return made;
      });
      Bucket& bucket = bucket_for(buckets, parameter, counter_key(state.step()));
      bucket.first.push_back(contiguous(state.sum()));
      bucket.step = state.step();
      advance_after_step(state);
    }
    launch_each(buckets, options.lr(), /*counted=*/true, [&](const Bucket& bucket, const auto& steps, const auto& lr,
                                                             const auto& grad_scale, const auto& found_inf) {
      at::_fused_adagrad_(bucket.params, bucket.grads, bucket.first, steps, lr, options.lr_decay(),
                          options.weight_decay(), options.eps(), /*maximize=*/false, grad_scale, found_inf);
    });
  }

  // kernel(bucket, steps, lr, grad_scale, found_inf) once per bucket: the step tensors (for optimizers
  // that count steps), the learning rate (a double, or the prepared tensor when recorded) and the
  // scaler's tensors on the bucket's device.
  template <class Kernel>
  void launch_each(std::map<BucketKey, Bucket>& buckets, double lr, bool counted, Kernel&& kernel) {
    for (auto& entry : buckets) {
      const Bucket& bucket = entry.second;  // (C++17 lambdas cannot capture structured bindings)
      const std::vector<at::Tensor> steps = counted ? steps_of(entry.first, bucket) : std::vector<at::Tensor>{};
      const at::Device device = bucket.params.front().device();
      const auto grad_scale = on_device(scaling_.grad_scale, device);
      const auto found_inf = on_device(scaling_.found_inf, device);
      with_learning_rate(lr, [&](const auto& rate) { kernel(bucket, steps, rate, grad_scale, found_inf); });
    }
  }

  // The state of a parameter with a gradient, made by make() when it has none (recorded in
  // created_ so a skipped step can remove it). A recorded step makes nothing.
  template <class State, class Make>
  State& state_of(const at::Tensor& parameter, Make make) {
    auto& states = optimizer_.state();
    void* key = parameter.unsafeGetTensorImpl();
    auto found = states.find(key);
    if (found == states.end()) {
      LF_CHECK(device_ == nullptr, RuntimeError,
               "CapturedStep: a parameter got its first gradient after the warm-up steps, so its optimizer state would "
               "be made inside the CUDA graph and reset by every replay. Give every trained parameter a gradient "
               "in every step (or raise CaptureOptions::warmup_steps).");
      found = states.emplace(key, make()).first;
      created_.push_back(key);
    }
    return static_cast<State&>(*found->second);
  }

  // fn(lr) with the group's learning rate: a double, or the prepared device tensor when recorded.
  template <class Fn>
  void with_learning_rate(double lr, Fn&& fn) {
    if (device_) {
      fn(device_->learning_rates.at(group_index_));
    } else {
      fn(lr);
    }
  }

  // The kernel's step tensors: one per bucket, repeated for every parameter (the kernels only read
  // it). Eager: made from the host counter. Recorded: the prepared tensor, incremented on the device.
  std::vector<at::Tensor> steps_of(const BucketKey& key, const Bucket& bucket) {
    at::Tensor step;
    if (device_) {
      const auto found = device_->steps.find({group_index_, std::get<0>(key), std::get<1>(key)});
      LF_CHECK(found != device_->steps.end(), RuntimeError,
               "CapturedStep: a parameter group, device or dtype has no prepared step counter (a parameter joined "
               "after the warm-up); build a new CapturedStep.");
      step = found->second;
      step.add_(1);
    } else {
      step = torch::full({}, static_cast<double>(bucket.step + 1), bucket.params.front().options().dtype(torch::kFloat32));
    }
    return std::vector<at::Tensor>(bucket.params.size(), step);
  }

  Bucket& bucket_for(std::map<BucketKey, Bucket>& buckets, const at::Tensor& parameter, int64_t discriminator) {
    Bucket& bucket = buckets[{parameter.device().str(), static_cast<int>(parameter.scalar_type()), discriminator}];
    bucket.params.push_back(parameter);
    bucket.grads.push_back(parameter.grad());
    return bucket;
  }

  // What tells buckets apart by host counter: the counter itself when eager (each bucket gets a
  // step tensor of its value); nothing when recorded, where one prepared tensor serves the group.
  int64_t counter_key(int64_t counter) const { return device_ ? 0 : counter; }

  // The counter advances on the host once the step is known to have run.
  template <class State>
  void advance_after_step(State& state) {
    advanced_.push_back([&state] { state.step(state.step() + 1); });
  }

  Optimizer& optimizer_;
  const FusedStepScaling& scaling_;
  internal::DeviceStepInputs* device_;
  size_t group_index_ = 0;
  std::vector<void*> created_;
  std::vector<std::function<void()>> advanced_;
};

// The host step counter of a parameter's state, for the optimizers that keep one.
std::optional<int64_t> counter_of(Kind kind, OptimizerParamState& state) {
  switch (kind) {
    case Kind::Adam: return static_cast<torch::optim::AdamParamState&>(state).step();
    case Kind::AdamW: return static_cast<torch::optim::AdamWParamState&>(state).step();
    case Kind::Adagrad: return static_cast<torch::optim::AdagradParamState&>(state).step();
    case Kind::Sgd: return std::nullopt;
  }
  return std::nullopt;
}
}  // namespace

std::optional<std::string> why_not_fused(const Optimizer& optimizer) {
  if (!kind_of(optimizer)) {
    return "the optimizer is not torch::optim::Adam, AdamW, SGD or Adagrad (exactly: subclasses may change step())";
  }
  const bool cpu_only = *kind_of(optimizer) == Kind::Adagrad;  // as Python: fused Adagrad is CPU-only
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) {
      if (auto why = why_not_tensor(parameter)) return why;
      if (cpu_only && !parameter.is_cpu()) {
        return "a parameter is on " + parameter.device().str() + "; fused Adagrad runs on cpu only (as in PyTorch)";
      }
    }
  }
  return std::nullopt;
}

bool fused_step(Optimizer& optimizer, const FusedStepScaling& scaling) {
  const auto why = why_not_fused(optimizer);
  LF_CHECK(!why, ValueError, "fused_step: ", *why, ". Step it with optimizer.step() instead.");
  torch::NoGradGuard no_grad;
  return FusedRun(optimizer, scaling).run(*kind_of(optimizer));
}

void run_optimizer_step(Optimizer& optimizer, const Optimizer::LossClosure& closure, StepKernel kernel) {
  if (kernel == StepKernel::LibTorch) {
    optimizer.step(closure);
    return;
  }
  if (closure) {
    at::AutoGradMode grad_on(true);
    closure();
  }
  fused_step(optimizer);
}

namespace internal {

void prepare_device_step(Optimizer& optimizer, DeviceStepInputs& inputs) {
  const Kind kind = *kind_of(optimizer);
  const bool first = inputs.learning_rates.empty();
  size_t index = 0;
  for (auto& group : optimizer.param_groups()) {
    const double lr = group.options().get_lr();
    if (first) {
      LF_CHECK(!group.params().empty(), ValueError, "CapturedStep: parameter group ", index, " has no parameters.");
      const auto options = group.params().front().options().dtype(torch::kFloat32);
      inputs.learning_rates.push_back(torch::full({}, lr, options));
      for (const auto& parameter : group.params()) {
        const auto found = optimizer.state().find(parameter.unsafeGetTensorImpl());
        if (found == optimizer.state().end()) continue;
        const auto counter = counter_of(kind, *found->second);
        if (!counter) continue;
        const std::tuple<size_t, std::string, int> key{index, parameter.device().str(),
                                                        static_cast<int>(parameter.scalar_type())};
        const auto [made, fresh] = inputs.steps.emplace(key, torch::full({}, static_cast<double>(*counter), options));
        LF_CHECK(fresh || made->second.item<double>() == static_cast<double>(*counter), ValueError,
                 "CapturedStep: the parameters of group ", index, " have different step counts (",
                 made->second.item<double>(), " and ", *counter, "): some missed a gradient in the warm-up steps. Give "
                 "every trained parameter a gradient in every step.");
      }
    } else {
      inputs.learning_rates.at(index).fill_(lr);
    }
    ++index;
  }
}

void queue_device_step(Optimizer& optimizer, DeviceStepInputs& inputs) {
  torch::NoGradGuard no_grad;
  const FusedStepScaling unscaled;
  FusedRun(optimizer, unscaled, &inputs).run(*kind_of(optimizer));
}

}  // namespace internal

}  // namespace lightning::fabric
