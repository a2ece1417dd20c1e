#include "lightning/fabric/utilities/activation_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_set>

#include "lightning/fabric/context_parallel/attention.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/internal/module_table.h"
#include "lightning/fabric/strategies/fsdp_unit.h"

namespace lightning::fabric {
namespace {

// The random state a recompute must start from: the CPU generator's and that of every CUDA device
// among the inputs (Python's checkpoint preserves the same set).
struct RandomState {
  at::Tensor cpu;
  std::vector<std::pair<c10::DeviceIndex, at::Tensor>> cuda;
};

at::Generator cuda_generator(c10::DeviceIndex index) {
  return at::globalContext().defaultGenerator(at::Device(at::kCUDA, index));
}

at::Tensor state_of(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

RandomState capture_random_state(const std::vector<at::Tensor>& inputs) {
  RandomState state;
  state.cpu = state_of(at::detail::getDefaultCPUGenerator());
  std::set<c10::DeviceIndex> devices;
  for (const auto& input : inputs) {
    if (input.defined() && input.is_cuda()) devices.insert(input.device().index());
  }
  for (c10::DeviceIndex index : devices) state.cuda.emplace_back(index, state_of(cuda_generator(index)));
  return state;
}

void restore_random_state(const RandomState& state) {
  set_state(at::detail::getDefaultCPUGenerator(), state.cpu);
  for (const auto& [index, tensor] : state.cuda) set_state(cuda_generator(index), tensor);
}

// Sets the forward's random state for the recompute; puts the current one back afterwards, so the
// training's random stream goes on as if no recompute had happened.
class RandomStateFork {
 public:
  explicit RandomStateFork(const RandomState& forward) : resume_(now_like(forward)) { restore_random_state(forward); }
  ~RandomStateFork() { restore_random_state(resume_); }
  RandomStateFork(const RandomStateFork&) = delete;
  RandomStateFork& operator=(const RandomStateFork&) = delete;

 private:
  static RandomState now_like(const RandomState& forward) {
    RandomState now;
    now.cpu = state_of(at::detail::getDefaultCPUGenerator());
    for (const auto& entry : forward.cuda) now.cuda.emplace_back(entry.first, state_of(cuda_generator(entry.first)));
    return now;
  }
  RandomState resume_;
};

// Autocast as the forward had it, on CPU and CUDA; the cast cache stays off during the recompute
// (a cached cast could outlive the storage of a parameter that fsdp regathered).
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;
  static AutocastState now() {
    return {at::autocast::is_autocast_enabled(at::kCPU), at::autocast::is_autocast_enabled(at::kCUDA),
            at::autocast::get_autocast_dtype(at::kCPU), at::autocast::get_autocast_dtype(at::kCUDA)};
  }
  void apply() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
  }
};

class AutocastAsIn {
 public:
  explicit AutocastAsIn(const AutocastState& forward)
      : resume_(AutocastState::now()), cache_was_enabled_(at::autocast::is_autocast_cache_enabled()) {
    forward.apply();
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastAsIn() {
    resume_.apply();
    at::autocast::set_autocast_cache_enabled(cache_was_enabled_);
  }
  AutocastAsIn(const AutocastAsIn&) = delete;
  AutocastAsIn& operator=(const AutocastAsIn&) = delete;

 private:
  AutocastState resume_;
  bool cache_was_enabled_;
};

// What the backward needs to run the function again.
struct CheckpointCall : torch::CustomClassHolder {
  CheckpointFunction fn;
  size_t input_count = 0;
  std::vector<bool> input_requires_grad;
  std::vector<at::Tensor> parameters;  // not saved_for_backward: fsdp swaps their storage in between
  RandomState random;
  AutocastState autocast;
  // The context-parallel region current at the forward (attention.h), made current again for the
  // recompute: the backward may run after the region ended, or on another thread.
  bool in_context_region = false;
  const DeviceMesh* context_mesh = nullptr;
  bool context_load_balance = true;
};

std::string tensor_text(const at::Tensor& tensor) {
  std::ostringstream text;
  text << tensor.scalar_type() << tensor.sizes();
  return text.str();
}

// Throws when the recomputed graph reaches a leaf that needs a gradient but is neither an input
// nor a listed parameter: without this it would silently get none.
void refuse_unlisted_leaves(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& targets) {
  std::unordered_set<const c10::TensorImpl*> listed;
  for (const auto& target : targets) listed.insert(target.unsafeGetTensorImpl());
  std::vector<torch::autograd::Node*> pending;
  std::unordered_set<const torch::autograd::Node*> seen;
  for (const auto& root : roots) {
    if (root.grad_fn()) pending.push_back(root.grad_fn().get());
  }
  while (!pending.empty()) {
    torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (auto* leaf = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      LF_CHECK(listed.count(leaf->variable.unsafeGetTensorImpl()) != 0, RuntimeError,
               "lf::checkpoint: the checkpointed function reads a tensor that requires grad (",
               tensor_text(leaf->variable), ") but is neither one of its inputs nor in `parameters`, so it would get "
               "no gradient. Pass it in `parameters` (lf::checkpoint(module, x) lists the module's parameters), "
               "or as an input.");
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function && seen.insert(edge.function.get()).second) pending.push_back(edge.function.get());
    }
  }
}

struct CheckpointNode : torch::autograd::Function<CheckpointNode> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<CheckpointCall> call, at::TensorList tensors) {
    const std::vector<at::Tensor> inputs(tensors.begin(), tensors.begin() + static_cast<std::ptrdiff_t>(call->input_count));
    ctx->save_for_backward(inputs);
    std::vector<at::Tensor> outputs = call->fn(inputs);  // grad mode is off here: nothing is kept
    torch::autograd::variable_list integral;  // one call: each call replaces the previous set
    for (const auto& output : outputs) {
      if (output.defined() && !output.is_floating_point() && !output.is_complex()) integral.push_back(output);
    }
    if (!integral.empty()) ctx->mark_non_differentiable(integral);
    ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto call = c10::static_intrusive_pointer_cast<CheckpointCall>(ctx->saved_data["call"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor input = saved[i].defined() ? saved[i].detach() : saved[i];
      if (input.defined() && call->input_requires_grad[i]) input.requires_grad_(true);
      inputs.push_back(input);
    }
    std::vector<at::Tensor> outputs;
    {
      RandomStateFork random(call->random);
      AutocastAsIn autocast(call->autocast);
      std::optional<context_parallel::Region> region;
      if (call->in_context_region) region.emplace(call->context_mesh, call->context_load_balance);
      torch::AutoGradMode grad_mode(true);
      outputs = call->fn(inputs);
    }
    std::vector<at::Tensor> roots, root_grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    std::vector<at::Tensor> targets;
    std::vector<size_t> target_slot;  // index among the forward's tensors
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && inputs[i].requires_grad()) {
        targets.push_back(inputs[i]);
        target_slot.push_back(i);
      }
    }
    for (size_t k = 0; k < call->parameters.size(); ++k) {
      if (call->parameters[k].requires_grad()) {
        targets.push_back(call->parameters[k]);
        target_slot.push_back(inputs.size() + k);
      }
    }
    torch::autograd::variable_list result(1 + inputs.size() + call->parameters.size());  // [0]: the call
    if (roots.empty() || targets.empty()) return result;
    refuse_unlisted_leaves(roots, targets);
    const auto grads = torch::autograd::grad(roots, targets, root_grads, /*retain_graph=*/false,
                                             /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t t = 0; t < targets.size(); ++t) result[1 + target_slot[t]] = grads[t];
    return result;
  }
};

// The modules apply_activation_checkpointing marked, each with the count of its checkpointed calls.
internal::ModuleTable<std::shared_ptr<std::atomic<uint64_t>>>& marked() {
  static internal::ModuleTable<std::shared_ptr<std::atomic<uint64_t>>> table;
  return table;
}

}  // namespace

std::vector<at::Tensor> detail::checkpoint_tensors(const CheckpointFunction& fn, const std::vector<at::Tensor>& inputs,
                                                   const std::vector<at::Tensor>& parameters) {
  LF_CHECK(static_cast<bool>(fn), ValueError, "lf::checkpoint: the function is empty.");
  if (!torch::GradMode::is_enabled()) return fn(inputs);  // no backward will come: nothing to save
  auto call = c10::make_intrusive<CheckpointCall>();
  call->fn = fn;
  call->input_count = inputs.size();
  for (const auto& input : inputs) call->input_requires_grad.push_back(input.defined() && input.requires_grad());
  call->parameters = parameters;
  call->random = capture_random_state(inputs);
  call->autocast = AutocastState::now();
  if (const context_parallel::Region* region = context_parallel::Region::current()) {
    call->in_context_region = true;
    call->context_mesh = region->mesh();
    call->context_load_balance = region->load_balance();
  }
  std::vector<at::Tensor> tensors = inputs;
  tensors.insert(tensors.end(), parameters.begin(), parameters.end());
  return CheckpointNode::apply(std::move(call), at::TensorList(tensors));
}

bool is_checkpointed(const torch::nn::Module& module) { return marked().get(module).has_value(); }

void detail::count_checkpointed_call(const torch::nn::Module& module) {
  if (const auto calls = marked().get(module)) ++**calls;
}

uint64_t detail::checkpointed_calls(const torch::nn::Module& module) {
  const auto calls = marked().get(module);
  return calls ? (*calls)->load() : 0;
}

int apply_activation_checkpointing(torch::nn::Module& root, const ModulePolicy& policy) {
  if (policy.empty()) return 0;
  int count = 0;
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    const std::shared_ptr<torch::nn::Module>& module = item.value();
    if (dynamic_cast<CheckpointedImpl*>(module.get()) != nullptr) continue;
    // A unit (or any wrapper) stands for its module, which is not in the tree itself.
    auto* wrapper = dynamic_cast<WrapperModule*>(module.get());
    const std::shared_ptr<torch::nn::Module>& subject = wrapper != nullptr ? wrapper->wrapped() : module;
    if (is_checkpointed(*subject) || !policy.matches(unwrapped(*subject), item.key())) continue;
    marked().set(*subject, std::make_shared<std::atomic<uint64_t>>(0));
    ++count;
  }
  // A Sequential calls its children itself: a marked child is wrapped so that the call checkpoints.
  replace_sequential_children(root, [](const torch::nn::AnyModule& child,
                                      const std::string&) -> std::optional<torch::nn::AnyModule> {
    if (dynamic_cast<WrapperModule*>(child.ptr().get()) != nullptr || !is_checkpointed(*child.ptr())) return std::nullopt;
    return torch::nn::AnyModule(Checkpointed(child));
  });
  return count;
}

CheckpointedImpl::CheckpointedImpl(torch::nn::AnyModule wrapped) : WrapperModule(wrapped.ptr()), forward_(std::move(wrapped)) {}

at::Tensor CheckpointedImpl::forward(at::Tensor input) {
  detail::count_checkpointed_call(*wrapped());
  return checkpoint([this](const at::Tensor& x) { return forward_.forward<at::Tensor>(x); }, input, wrapped()->parameters());
}

}  // namespace lightning::fabric
