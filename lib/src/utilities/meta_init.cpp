// Recording a build on meta tensors and replaying it on real devices (meta_init.h), and the one
// kernel behind the DeferredInit dispatch key that meta_init_guard and empty_init_guard share.
#include "lightning/fabric/utilities/meta_init.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/equal.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/utilities/init_mode.h"

namespace lightning::fabric {

namespace {

// A meta tensor as a step saw it. In-place operators such as t_ or set_ change the live object
// later; a tensor object no step returned is rebuilt from this on its storage's real counterpart.
struct Geometry {
  const c10::StorageImpl* storage = nullptr;
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::ScalarType::Float;
};

struct RecordedStep {
  c10::OperatorHandle op;
  std::vector<c10::IValue> inputs;   // as called (a factory with its own device), meta tensors by reference
  std::vector<c10::IValue> outputs;  // what it returned
  c10::ScalarType default_dtype;     // factories without a dtype take this one
  std::vector<Geometry> input_geometry;                  // each meta input, in visiting order, before the step
  std::vector<const c10::StorageImpl*> output_storages;  // each meta output's storage, after it
};

// One outermost meta_init_guard's build.
struct BuildRecord {
  std::vector<RecordedStep> steps;
  at::Tensor generator_state;                       // the CPU generator at the guard's start
  // Storages of the meta tensors some step returned. Tensors are known by storage, not by object:
  // LibTorch's factories hand out a new tensor object over the storage an operator returned.
  // (The steps keep those storages alive, so their addresses stay unique while the record exists.)
  std::unordered_set<const c10::StorageImpl*> made;
  // Storages meant for another device than the CPU (a factory's device argument), and the first
  // operator that drew random numbers from a generator the ranks need not share (an explicit one,
  // or such a device's): empty when every draw came from the CPU default generator.
  std::unordered_set<const c10::StorageImpl*> off_cpu;
  std::string unshared_draw;
};

std::mutex registry_mutex;
std::vector<std::shared_ptr<BuildRecord>> registry;  // in creation order

thread_local internal::InitMode thread_mode = internal::InitMode::Normal;
thread_local std::shared_ptr<BuildRecord> thread_record;

template <typename F>
void for_each_tensor(const c10::IValue& value, const F& visit) {
  if (value.isTensor()) {
    visit(value.toTensor());
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) for_each_tensor(element, visit);
  }
}

// value with every meta tensor replaced by real(tensor).
template <typename F>
c10::IValue substitute(const c10::IValue& value, const F& real) {
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    return tensor.defined() && tensor.is_meta() ? c10::IValue(real(tensor)) : value;
  }
  if (value.isList()) {
    c10::impl::GenericList list(value.toList().elementType());
    for (const c10::IValue& element : value.toListRef()) list.push_back(substitute(element, real));
    return list;
  }
  return value;
}

// Calls visit(recorded meta tensor, produced tensor) for each tensor returned by a replayed step.
template <typename F>
void pair_outputs(const c10::IValue& recorded, const c10::IValue& produced, const F& visit) {
  if (recorded.isTensor() && produced.isTensor()) {
    if (recorded.toTensor().defined() && recorded.toTensor().is_meta()) visit(recorded.toTensor(), produced.toTensor());
  } else if (recorded.isList() && produced.isList()) {
    const auto mine = recorded.toListRef(), theirs = produced.toListRef();
    for (size_t i = 0; i < mine.size() && i < theirs.size(); ++i) pair_outputs(mine[i], theirs[i], visit);
  }
}

const c10::StorageImpl* storage_of(const at::Tensor& tensor) {
  return tensor.has_storage() ? tensor.storage().unsafeGetStorageImpl() : nullptr;
}

Geometry geometry_of(const at::Tensor& tensor) {
  return Geometry{storage_of(tensor), tensor.storage_offset(), tensor.sizes().vec(), tensor.strides().vec(),
                  tensor.scalar_type()};
}

bool is_random_fill(const c10::OperatorHandle& op) {
  static const std::set<std::string> fills{"aten::uniform_", "aten::normal_", "aten::random_", "aten::bernoulli_"};
  return fills.count(op.schema().name()) > 0;
}

// Boxed `op_(Tensor(a!) self, ...) -> Tensor(a!)`: drops the arguments, returns self.
void return_self_untouched(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto count = op.schema().arguments().size();
  c10::IValue self = (*stack)[stack->size() - count];
  torch::jit::drop(*stack, count);
  stack->push_back(std::move(self));
}

// Meta mode: a factory (no tensor argument, a device argument) runs on the meta device; an
// operator that reads or writes a meta tensor runs on meta tensors; both are recorded. Operators
// on real tensors only run as usual. Operators called from inside these are not recorded.
void record_on_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const auto first = stack->end() - static_cast<std::ptrdiff_t>(arguments.size());
  bool any_tensor = false, any_meta = false;
  for (auto it = first; it != stack->end(); ++it) {
    for_each_tensor(*it, [&](const at::Tensor& tensor) {
      any_tensor |= tensor.defined();
      any_meta |= tensor.defined() && tensor.is_meta();
    });
  }
  std::optional<size_t> device_argument;
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].name() == "device") device_argument = i;
  }
  const bool factory = !any_tensor && device_argument.has_value();
  c10::impl::ExcludeDispatchKeyGuard not_again(c10::DispatchKey::DeferredInit);
  if (!any_meta && !factory) {
    op.callBoxed(stack);
    return;
  }
  BuildRecord& record = *thread_record;
  RecordedStep step{op, std::vector<c10::IValue>(first, stack->end()), {}, c10::get_default_dtype_as_scalartype(), {}, {}};
  bool on_another_device = false, explicit_generator = false, draws = false;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& value = step.inputs[i];
    if (arguments[i].name() == "generator") draws = true, explicit_generator |= !value.isNone();
    if (factory && i == *device_argument && !value.isNone()) on_another_device |= !value.toDevice().is_cpu();
  }
  for (const auto& input : step.inputs) {
    for_each_tensor(input, [&](const at::Tensor& tensor) {
      if (!tensor.defined() || !tensor.is_meta()) return;
      step.input_geometry.push_back(geometry_of(tensor));
      on_another_device |= record.off_cpu.count(storage_of(tensor)) > 0;
    });
  }
  if (draws && (explicit_generator || on_another_device) && record.unshared_draw.empty()) {
    record.unshared_draw = op.schema().name() + (explicit_generator ? " with an explicit generator" : " on a device");
  }
  if (factory) {
    first[static_cast<std::ptrdiff_t>(*device_argument)] = c10::IValue(c10::Device(c10::kMeta));
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (arguments[i].name() == "pin_memory") first[static_cast<std::ptrdiff_t>(i)] = c10::IValue();
    }
  }
  try {
    op.callBoxed(stack);
  } catch (const c10::NotImplementedError&) {
    throw RuntimeError("meta_init_guard: " + op.schema().name() + " has no meta-device kernel in LibTorch's C++ "
                       "build, so it cannot run while a model is built on the meta device. Compute its result before "
                       "the guard (a constant table, say), or build this model normally.");
  }
  const size_t returns = op.schema().returns().size();
  step.outputs.assign(stack->end() - static_cast<std::ptrdiff_t>(returns), stack->end());
  for (const auto& output : step.outputs) {
    for_each_tensor(output, [&](const at::Tensor& tensor) {
      if (!tensor.defined() || !tensor.is_meta()) return;
      record.made.insert(storage_of(tensor));
      step.output_storages.push_back(storage_of(tensor));
      if (on_another_device) record.off_cpu.insert(storage_of(tensor));
    });
  }
  record.steps.push_back(std::move(step));
}

void deferred_init_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (thread_mode == internal::InitMode::Meta && thread_record) return record_on_meta(op, stack);
  if (thread_mode == internal::InitMode::SkipRandomFills && is_random_fill(op)) return return_self_untouched(op, stack);
  // Everything else runs as usual; operators it calls come back here (a randn's normal_ is skipped).
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::DeferredInit), stack);
}

at::Tensor generator_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(const at::Tensor& state) {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// A meta parameter or buffer of the module being materialised.
struct Target {
  std::string name;
  bool parameter = false;
  at::Tensor tensor;  // the module's own
  const c10::StorageImpl* storage = nullptr;
  bool installed = false;
};

void replay(BuildRecord& record, std::vector<Target*>& targets, const MaterializeOptions& options) {
  const auto& steps = record.steps;
  // The last step that touches each storage: the values on it are final after that step.
  std::unordered_map<const c10::StorageImpl*, size_t> last_use;
  for (size_t i = 0; i < steps.size(); ++i) {
    for (const Geometry& geometry : steps[i].input_geometry) last_use[geometry.storage] = i;
    for (const c10::StorageImpl* storage : steps[i].output_storages) last_use[storage] = i;
  }
  std::vector<std::vector<const c10::StorageImpl*>> ending(steps.size());
  for (const auto& [storage, step] : last_use) ending[step].push_back(storage);
  std::unordered_multimap<const c10::StorageImpl*, Target*> targets_on;
  for (Target* target : targets) targets_on.emplace(target->storage, target);

  // The real tensor of each meta tensor a step returned, and the real storage of each meta storage:
  // a meta tensor no step returned (a factory's fresh tensor object, a view) is its geometry on it.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> real;
  std::unordered_map<const c10::StorageImpl*, c10::Storage> real_storage;
  std::unordered_map<const c10::StorageImpl*, std::vector<const c10::TensorImpl*>> made_on;
  auto real_of = [&](const at::Tensor& meta, const Geometry& geometry) -> std::optional<at::Tensor> {
    const auto found = real.find(meta.unsafeGetTensorImpl());
    if (found != real.end()) return found->second;
    const auto storage = real_storage.find(geometry.storage);
    if (storage == real_storage.end()) return std::nullopt;
    return at::empty({0}, at::TensorOptions().dtype(geometry.dtype).device(storage->second.device()))
        .set_(storage->second, geometry.offset, geometry.sizes, geometry.strides);
  };
  at::Tensor before = generator_state();
  at::Tensor start = record.generator_state.clone();
  if (options.agree_on_generator_state) options.agree_on_generator_state(start);
  set_generator_state(start);
  bool keep_replayed_state = false;  // set at the end when nothing drew from the generator since the guard's start
  ScopeGuard restore_generator([&] {
    if (!keep_replayed_state) set_generator_state(before);
  });
  const c10::ScalarType default_dtype = c10::get_default_dtype_as_scalartype();
  ScopeGuard restore_dtype([default_dtype] { c10::set_default_dtype(c10::scalarTypeToTypeMeta(default_dtype)); });
  c10::impl::ExcludeDispatchKeyGuard not_recorded(c10::DispatchKey::DeferredInit);
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < steps.size(); ++i) {
    const RecordedStep& step = steps[i];
    const std::string name = step.op.schema().name();
    torch::jit::Stack stack;
    size_t visited = 0;  // meta inputs so far, in the order the geometry was noted
    for (const auto& input : step.inputs) {
      stack.push_back(substitute(input, [&](const at::Tensor& meta) {
        auto found = real_of(meta, step.input_geometry.at(visited++));
        LF_CHECK(found.has_value(), ValueError, "materialize_module: the recorded ", name, " reads a meta tensor that no "
                 "operation under the guard made (one made on the meta device by hand?). Make every tensor of the "
                 "module under lf::meta_init_guard / fabric.init_module(true), or on a real device.");
        return *found;
      }));
    }
    c10::set_default_dtype(c10::scalarTypeToTypeMeta(step.default_dtype));
    try {
      step.op.callBoxed(&stack);
    } catch (const c10::Error& error) {
      throw RuntimeError("materialize_module: replaying " + name + " of the module's build failed: " +
                         error.what_without_backtrace());
    }
    const size_t returns = step.op.schema().returns().size();
    for (size_t k = 0; k < returns && k < step.outputs.size(); ++k) {
      pair_outputs(step.outputs[k], stack[stack.size() - returns + k], [&](const at::Tensor& meta, const at::Tensor& value) {
        real[meta.unsafeGetTensorImpl()] = value;
        real_storage[storage_of(meta)] = value.storage();
        made_on[storage_of(meta)].push_back(meta.unsafeGetTensorImpl());
      });
    }
    for (const c10::StorageImpl* storage : ending[i]) {
      auto [begin, end] = targets_on.equal_range(storage);
      for (auto it = begin; it != end; ++it) {
        Target& target = *it->second;
        const at::Tensor full = real_of(target.tensor, geometry_of(target.tensor)).value();
        const at::Tensor value = options.install ? options.install(target.name, target.parameter, full) : full;
        target.tensor.unsafeGetTensorImpl()->shallow_copy_from(value.getIntrusivePtr());
        target.installed = true;
      }
      for (const c10::TensorImpl* impl : made_on[storage]) real.erase(impl);
      made_on.erase(storage);
      real_storage.erase(storage);
    }
  }
  // Nothing drew from the generator since the guard's start, and the replay started there.
  keep_replayed_state = at::equal(before, record.generator_state) && at::equal(start, record.generator_state);
}

std::shared_ptr<BuildRecord> record_of(const at::Tensor& tensor, const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (const auto& record : registry) {
    if (record->made.count(storage_of(tensor)) > 0) return record;
  }
  throw ValueError("materialize_module: '" + name + "' is on the meta device but no record of its build is left, so "
                   "its values are unknown: it was made on the meta device by hand, or built under the same guard as "
                   "a module materialised before (whose record is spent). Build each model under a guard of its own "
                   "(fabric.init_module(true) or lf::meta_init_guard() once per model), or on a real device.");
}

}  // namespace

namespace internal {
ScopeGuard init_mode_guard(InitMode mode) {
  const InitMode previous_mode = thread_mode;
  std::shared_ptr<BuildRecord> previous_record = thread_record;
  if (mode == InitMode::Meta && !thread_record) {
    auto record = std::make_shared<BuildRecord>();
    record->generator_state = generator_state();  // before the key is included: it makes a tensor
    std::lock_guard<std::mutex> lock(registry_mutex);
    registry.push_back(record);
    thread_record = std::move(record);
  }
  auto include = std::make_shared<c10::impl::IncludeDispatchKeyGuard>(c10::DispatchKey::DeferredInit);
  thread_mode = mode;
  return ScopeGuard([include, previous_mode, previous_record]() mutable {
    thread_mode = previous_mode;
    thread_record = previous_record;
    include.reset();
  });
}
}  // namespace internal

TORCH_LIBRARY_IMPL(_, DeferredInit, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&deferred_init_kernel>());
}

ScopeGuard meta_init_guard() { return internal::init_mode_guard(internal::InitMode::Meta); }

bool has_meta_tensors(const torch::nn::Module& module) {
  for (const auto& parameter : module.parameters()) {
    if (parameter.defined() && parameter.is_meta()) return true;
  }
  for (const auto& buffer : module.buffers()) {
    if (buffer.defined() && buffer.is_meta()) return true;
  }
  return false;
}

void materialize_module(torch::nn::Module& module, const MaterializeOptions& options) {
  std::vector<Target> targets;
  std::unordered_set<const c10::TensorImpl*> seen;  // a tied tensor is installed once, under its first name
  auto collect = [&](const std::string& name, const at::Tensor& tensor, bool parameter) {
    if (!tensor.defined() || !tensor.is_meta() || !seen.insert(tensor.unsafeGetTensorImpl()).second) return;
    targets.push_back(Target{name, parameter, tensor, storage_of(tensor)});
  };
  for (const auto& item : module.named_parameters()) collect(item.key(), item.value(), true);
  for (const auto& item : module.named_buffers()) collect(item.key(), item.value(), false);
  // Grouped by record, replayed in the order the records were made.
  std::vector<std::pair<std::shared_ptr<BuildRecord>, std::vector<Target*>>> groups;
  for (Target& target : targets) {
    auto record = record_of(target.tensor, target.name);
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == record; });
    if (group == groups.end()) group = groups.insert(groups.end(), {record, {}});
    group->second.push_back(&target);
  }
  for (auto& [record, members] : groups) {
    LF_CHECK(!options.require_shared_generator || record->unshared_draw.empty(), ValueError, "materialize_module: '",
             members.front()->name, "' was built with ", record->unshared_draw, ", whose random state the ranks do "
             "not share, so their replays could disagree. Build the model with the CPU default generator (and move it "
             "at setup), or build it normally.");
    auto drop = [&record = record] {
      std::lock_guard<std::mutex> lock(registry_mutex);
      registry.erase(std::remove(registry.begin(), registry.end(), record), registry.end());
    };
    try {
      replay(*record, members, options);
    } catch (const ValueError& error) {
      drop();
      throw ValueError(std::string(error.what()) + " The module is left half materialised: build it again.");
    } catch (const std::exception& error) {
      drop();
      throw RuntimeError(std::string(error.what()) + " The module is left half materialised: build it again.");
    }
    drop();
  }
  for (const Target& target : targets) {
    LF_CHECK(target.installed, ValueError, "materialize_module: '", target.name, "' was made under the guard but no "
             "recorded operation wrote it.");
  }
}

}  // namespace lightning::fabric
