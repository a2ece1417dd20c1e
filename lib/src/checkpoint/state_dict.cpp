#include "lightning/fabric/checkpoint/state_dict.h"

#include "lightning/fabric/checkpoint/background_write.h"
#include "lightning/fabric/checkpoint/optimizer_names.h"

#include <torch/optim.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

StateDict make_state_dict() { return StateDict(c10::StringType::get(), c10::AnyType::get()); }

// ---- StateEntry ------------------------------------------------------------------------------

namespace {
const char* kind_name(StateEntry::Kind kind) {
  switch (kind) {
    case StateEntry::Kind::Object: return "a live object";
    case StateEntry::Kind::Value: return "a plain value";
    case StateEntry::Kind::Nested: return "a nested State";
  }
  return "?";
}
void expect_kind(StateEntry::Kind actual, StateEntry::Kind wanted) {
  LF_CHECK(actual == wanted, RuntimeError, "StateEntry: this entry holds ", kind_name(actual), ", not ",
           kind_name(wanted), ".");
}

// A built-in live object seen through Stateful: its two state-dict functions.
class AdaptedState : public Stateful {
 public:
  AdaptedState(std::function<StateDict()> save, std::function<void(const StateDict&)> load)
      : save_(std::move(save)), load_(std::move(load)) {}
  StateDict state_dict() const override { return save_(); }
  void load_state_dict(const StateDict& state) override { load_(state); }

 private:
  std::function<StateDict()> save_;
  std::function<void(const StateDict&)> load_;
};
}  // namespace

StateEntry::StateEntry(std::shared_ptr<torch::nn::Module> module) : kind_(Kind::Object), module_(std::move(module)) {
  if (!module_) return;
  torch::nn::Module* held = module_.get();  // module_ keeps it alive as long as object_
  object_ = std::make_shared<AdaptedState>([held] { return module_state_dict(*held); },
                                           [held](const StateDict& state) { load_module_state_dict(*held, state); });
}
StateEntry::StateEntry(torch::optim::Optimizer& optimizer)
    : kind_(Kind::Object),
      object_(std::make_shared<AdaptedState>([&optimizer] { return optimizer_state_dict(optimizer); },
                                             [&optimizer](const StateDict& state) { load_optimizer_state_dict(optimizer, state); })),
      optimizer_(&optimizer) {}
StateEntry::StateEntry(torch::optim::LRScheduler& scheduler)
    : kind_(Kind::Object),
      object_(std::make_shared<AdaptedState>([&scheduler] { return scheduler_state_dict(scheduler); },
                                             [&scheduler](const StateDict& state) { load_scheduler_state_dict(scheduler, state); })) {}
StateEntry::StateEntry(std::shared_ptr<Stateful> object) : kind_(Kind::Object), object_(std::move(object)) {}
StateEntry::StateEntry(State nested) : kind_(Kind::Nested), nested_(std::make_shared<State>(std::move(nested))) {}

const c10::IValue& StateEntry::value() const { expect_kind(kind_, Kind::Value); return value_; }
Stateful& StateEntry::object() const {
  expect_kind(kind_, Kind::Object);
  LF_CHECK(object_ != nullptr, ValueError, "StateEntry: this entry holds a null object (e.g. the loss scaler of a ",
           "precision without one). Leave the entry out of the State, or pass an object.");
  return *object_;
}
State& StateEntry::nested() const { expect_kind(kind_, Kind::Nested); return *nested_; }
void StateEntry::set_value(c10::IValue value) { expect_kind(kind_, Kind::Value); value_ = std::move(value); }

// ---- modules ---------------------------------------------------------------------------------

StateDict module_state_dict(const torch::nn::Module& module) {
  StateDict state = make_state_dict();
  for (const auto& item : module.named_parameters(/*recurse=*/true)) state.insert(item.key(), saved_tensor(item.value()));
  for (const auto& item : module.named_buffers(/*recurse=*/true)) state.insert(item.key(), saved_tensor(item.value()));
  return state;
}

namespace {
c10::IValue snapshot_value(const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    if (!tensor.defined()) return value;
    return tensor.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
  }
  if (value.isGenericDict()) {
    const c10::impl::GenericDict source = value.toGenericDict();
    c10::impl::GenericDict copy(source.keyType(), source.valueType());
    for (const auto& item : source) copy.insert(item.key(), snapshot_value(item.value()));
    return copy;
  }
  if (value.isList()) {
    const c10::List<c10::IValue> source = value.toList();
    c10::impl::GenericList copy(source.elementType());
    copy.reserve(source.size());
    for (const c10::IValue& element : source) copy.push_back(snapshot_value(element));
    return copy;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& element : value.toTupleRef().elements()) elements.push_back(snapshot_value(element));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return value;  // numbers, strings, None: immutable
}
}  // namespace

StateDict snapshot_state_dict(const StateDict& state) {
  torch::NoGradGuard no_grad;
  return snapshot_value(c10::IValue(state)).toGenericDict();
}

void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict) {
  auto own = module.named_parameters(true);
  for (const auto& buffer : module.named_buffers(true)) own.insert(buffer.key(), buffer.value());
  std::string missing, unexpected;
  for (const auto& item : own) {
    if (!state.contains(item.key())) missing += (missing.empty() ? "" : ", ") + item.key();
  }
  for (const auto& item : state) {
    if (!own.contains(item.key().toStringRef())) unexpected += (unexpected.empty() ? "" : ", ") + item.key().toStringRef();
  }
  LF_CHECK(!strict || (missing.empty() && unexpected.empty()), RuntimeError,
           "load_state_dict(strict=true): the state does not match the module. Missing keys: [", missing,
           "]; unexpected keys: [", unexpected, "]. Pass strict=false to load the keys that match.");
  torch::NoGradGuard no_grad;
  for (auto& item : own) {
    auto found = state.find(item.key());
    if (found == state.end()) continue;
    LF_CHECK(found->value().isTensor(), ValueError, "load_state_dict: '", item.key(), "' is a ",
             found->value().tagKind(), " in the state, not a tensor.");
    const at::Tensor source = found->value().toTensor();
    LF_CHECK(source.sizes() == item.value().sizes(), RuntimeError, "load_state_dict: '", item.key(), "' has shape ",
             source.sizes(), " in the state but ", item.value().sizes(), " in the module.");
    item.value().copy_(source);
  }
}

// ---- optimizers ------------------------------------------------------------------------------

namespace {
double as_double(const c10::IValue& value) { return value.isDouble() ? value.toDouble() : static_cast<double>(value.toInt()); }

c10::IValue cpu_or_none(const at::Tensor& tensor) { return tensor.defined() ? c10::IValue(saved_tensor(tensor)) : c10::IValue(); }

// One typed optimizer: how its options and per-parameter state map to named values.
struct OptimizerCodec {
  const char* name;
  bool (*matches)(const torch::optim::Optimizer&);
  void (*save_options)(const torch::optim::OptimizerOptions&, StateDict&);
  void (*load_options)(torch::optim::OptimizerOptions&, const StateDict&);
  void (*save_state)(const torch::optim::OptimizerParamState&, StateDict&);
  std::unique_ptr<torch::optim::OptimizerParamState> (*load_state)(const StateDict&, const at::Tensor& parameter);
};

at::Tensor tensor_for(const StateDict& state, const char* key, const at::Tensor& parameter) {
  auto found = state.find(key);
  if (found == state.end() || found->value().isNone()) return at::Tensor();
  at::Tensor value = found->value().toTensor();
  LF_CHECK(value.dim() == 0 || value.sizes() == parameter.sizes(), ValueError, "load_optimizer_state_dict: \"", key,
           "\" has shape ", value.sizes(), " in the state but its parameter has shape ", parameter.sizes(), ".");
  return value.dim() == 0 ? value.to(parameter.device()) : value.to(parameter.device(), parameter.scalar_type());
}
int64_t int_for(const StateDict& state, const char* key) {
  auto found = state.find(key);
  if (found == state.end()) return 0;
  const auto& value = found->value();
  return value.isTensor() ? value.toTensor().item<int64_t>() : static_cast<int64_t>(as_double(value));
}
double number_for(const StateDict& state, const char* key) {
  auto found = state.find(key);
  LF_CHECK(found != state.end(), ValueError, "load_optimizer_state_dict: param_groups entry lacks \"", key, "\".");
  return as_double(found->value());
}
c10::IValue betas_value(const std::tuple<double, double>& betas) {
  c10::List<double> list;
  list.push_back(std::get<0>(betas));
  list.push_back(std::get<1>(betas));
  return list;
}
std::tuple<double, double> betas_for(const StateDict& state) {
  auto found = state.find("betas");
  LF_CHECK(found != state.end(), ValueError, "load_optimizer_state_dict: param_groups entry lacks \"betas\".");
  const auto& value = found->value();  // a list from C++, a tuple from Python
  if (value.isTuple()) return {as_double(value.toTupleRef().elements().at(0)), as_double(value.toTupleRef().elements().at(1))};
  auto list = value.toList();
  return {as_double(list.get(0)), as_double(list.get(1))};
}

template <class Optimizer>
bool is(const torch::optim::Optimizer& optimizer) { return dynamic_cast<const Optimizer*>(&optimizer) != nullptr; }

// Adam and AdamW share their layout.
template <class Options>
void save_adam_options(const torch::optim::OptimizerOptions& base, StateDict& out) {
  const auto& o = static_cast<const Options&>(base);
  out.insert("lr", o.lr()); out.insert("betas", betas_value(o.betas())); out.insert("eps", o.eps());
  out.insert("weight_decay", o.weight_decay()); out.insert("amsgrad", o.amsgrad());
}
template <class Options>
void load_adam_options(torch::optim::OptimizerOptions& base, const StateDict& in) {
  auto& o = static_cast<Options&>(base);
  o.lr(number_for(in, "lr")); o.betas(betas_for(in)); o.eps(number_for(in, "eps"));
  o.weight_decay(number_for(in, "weight_decay"));
}
template <class ParamState>
void save_adam_state(const torch::optim::OptimizerParamState& base, StateDict& out) {
  const auto& s = static_cast<const ParamState&>(base);
  out.insert("step", s.step()); out.insert("exp_avg", cpu_or_none(s.exp_avg()));
  out.insert("exp_avg_sq", cpu_or_none(s.exp_avg_sq()));
  if (s.max_exp_avg_sq().defined()) out.insert("max_exp_avg_sq", cpu_or_none(s.max_exp_avg_sq()));
}
template <class ParamState>
std::unique_ptr<torch::optim::OptimizerParamState> load_adam_state(const StateDict& in, const at::Tensor& p) {
  auto s = std::make_unique<ParamState>();
  s->step(int_for(in, "step")); s->exp_avg(tensor_for(in, "exp_avg", p)); s->exp_avg_sq(tensor_for(in, "exp_avg_sq", p));
  s->max_exp_avg_sq(tensor_for(in, "max_exp_avg_sq", p));
  return s;
}

const std::vector<OptimizerCodec>& codecs() {
  using namespace torch::optim;
  static const std::vector<OptimizerCodec> all = {
      {"SGD", &is<SGD>,
       [](const OptimizerOptions& base, StateDict& out) {
         const auto& o = static_cast<const SGDOptions&>(base);
         out.insert("lr", o.lr()); out.insert("momentum", o.momentum()); out.insert("dampening", o.dampening());
         out.insert("weight_decay", o.weight_decay()); out.insert("nesterov", o.nesterov());
       },
       [](OptimizerOptions& base, const StateDict& in) {
         auto& o = static_cast<SGDOptions&>(base);
         o.lr(number_for(in, "lr")); o.momentum(number_for(in, "momentum")); o.dampening(number_for(in, "dampening"));
         o.weight_decay(number_for(in, "weight_decay"));
       },
       [](const OptimizerParamState& base, StateDict& out) {
         out.insert("momentum_buffer", cpu_or_none(static_cast<const SGDParamState&>(base).momentum_buffer()));
       },
       [](const StateDict& in, const at::Tensor& p) -> std::unique_ptr<OptimizerParamState> {
         auto s = std::make_unique<SGDParamState>();
         s->momentum_buffer(tensor_for(in, "momentum_buffer", p));
         return s;
       }},
      {"Adam", &is<Adam>, &save_adam_options<AdamOptions>, &load_adam_options<AdamOptions>,
       &save_adam_state<AdamParamState>, &load_adam_state<AdamParamState>},
      {"AdamW", &is<AdamW>, &save_adam_options<AdamWOptions>, &load_adam_options<AdamWOptions>,
       &save_adam_state<AdamWParamState>, &load_adam_state<AdamWParamState>},
      {"RMSprop", &is<RMSprop>,
       [](const OptimizerOptions& base, StateDict& out) {
         const auto& o = static_cast<const RMSpropOptions&>(base);
         out.insert("lr", o.lr()); out.insert("alpha", o.alpha()); out.insert("eps", o.eps());
         out.insert("weight_decay", o.weight_decay()); out.insert("momentum", o.momentum()); out.insert("centered", o.centered());
       },
       [](OptimizerOptions& base, const StateDict& in) {
         auto& o = static_cast<RMSpropOptions&>(base);
         o.lr(number_for(in, "lr")); o.alpha(number_for(in, "alpha")); o.eps(number_for(in, "eps"));
         o.weight_decay(number_for(in, "weight_decay")); o.momentum(number_for(in, "momentum"));
       },
       [](const OptimizerParamState& base, StateDict& out) {
         const auto& s = static_cast<const RMSpropParamState&>(base);
         out.insert("step", s.step()); out.insert("square_avg", cpu_or_none(s.square_avg()));
         if (s.momentum_buffer().defined()) out.insert("momentum_buffer", cpu_or_none(s.momentum_buffer()));
         if (s.grad_avg().defined()) out.insert("grad_avg", cpu_or_none(s.grad_avg()));
       },
       [](const StateDict& in, const at::Tensor& p) -> std::unique_ptr<OptimizerParamState> {
         auto s = std::make_unique<RMSpropParamState>();
         s->step(int_for(in, "step")); s->square_avg(tensor_for(in, "square_avg", p));
         s->momentum_buffer(tensor_for(in, "momentum_buffer", p)); s->grad_avg(tensor_for(in, "grad_avg", p));
         return s;
       }},
      {"Adagrad", &is<Adagrad>,
       [](const OptimizerOptions& base, StateDict& out) {
         const auto& o = static_cast<const AdagradOptions&>(base);
         out.insert("lr", o.lr()); out.insert("lr_decay", o.lr_decay()); out.insert("weight_decay", o.weight_decay());
         out.insert("initial_accumulator_value", o.initial_accumulator_value()); out.insert("eps", o.eps());
       },
       [](OptimizerOptions& base, const StateDict& in) {
         auto& o = static_cast<AdagradOptions&>(base);
         o.lr(number_for(in, "lr")); o.lr_decay(number_for(in, "lr_decay")); o.weight_decay(number_for(in, "weight_decay"));
         o.eps(number_for(in, "eps"));
       },
       [](const OptimizerParamState& base, StateDict& out) {
         const auto& s = static_cast<const AdagradParamState&>(base);
         out.insert("step", s.step()); out.insert("sum", cpu_or_none(s.sum()));
       },
       [](const StateDict& in, const at::Tensor& p) -> std::unique_ptr<OptimizerParamState> {
         auto s = std::make_unique<AdagradParamState>();
         s->step(int_for(in, "step")); s->sum(tensor_for(in, "sum", p));
         return s;
       }},
  };
  return all;
}

const OptimizerCodec* codec_for(const torch::optim::Optimizer& optimizer) {
  for (const auto& codec : codecs()) {
    if (codec.matches(optimizer)) return &codec;
  }
  return nullptr;
}

// The key of a parameter in torch::optim::Optimizer::state(): its TensorImpl.
void* state_key(const at::Tensor& parameter) { return parameter.unsafeGetTensorImpl(); }

StateDict archive_state_dict(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  std::ostringstream bytes;
  try {
    optimizer.save(archive);
    archive.save_to(bytes);
  } catch (const c10::Error& error) {
    throw RuntimeError(std::string("optimizer_state_dict: this optimizer type has no state-dict codec here (SGD, Adam, "
                                   "AdamW, RMSprop, Adagrad have), and LibTorch's own serialisation of it failed: ") +
                       error.what_without_backtrace());
  }
  const std::string data = bytes.str();
  StateDict out = make_state_dict();
  out.insert("libtorch_archive",
             torch::from_blob(const_cast<char*>(data.data()), {static_cast<int64_t>(data.size())}, torch::kUInt8).clone());
  return out;
}
}  // namespace

StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer) {
  const OptimizerCodec* codec = codec_for(optimizer);
  if (codec == nullptr) return archive_state_dict(optimizer);
  c10::impl::GenericDict per_parameter(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    StateDict group_dict = make_state_dict();
    codec->save_options(group.options(), group_dict);
    c10::List<int64_t> indices;
    for (const auto& parameter : group.params()) {
      auto found = optimizer.state().find(state_key(parameter));
      if (found != optimizer.state().end()) {
        StateDict entry = make_state_dict();
        codec->save_state(*found->second, entry);
        per_parameter.insert(index, entry);
      }
      indices.push_back(index++);
    }
    group_dict.insert("params", indices);
    groups.push_back(group_dict);
  }
  StateDict out = make_state_dict();
  out.insert("state", per_parameter);
  out.insert("param_groups", groups);
  return out;
}

void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state) {
  const OptimizerCodec* codec = codec_for(optimizer);
  if (codec == nullptr || state.contains("libtorch_archive")) {
    LF_CHECK(codec == nullptr && state.contains("libtorch_archive"), ValueError,
             "load_optimizer_state_dict: the state was saved from a different kind of optimizer (",
             codec ? codec->name : "a LibTorch archive", " here). Build the same optimizer type as in the run that saved it.");
    const at::Tensor bytes = state.at("libtorch_archive").toTensor().contiguous();
    torch::serialize::InputArchive archive;
    archive.load_from(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
    optimizer.load(archive);
    return;
  }
  LF_CHECK(state.contains("param_groups") && state.contains("state"), ValueError,
           "load_optimizer_state_dict: expected the keys \"state\" and \"param_groups\" (a ", codec->name,
           " state dict).");
  const auto groups = state.at("param_groups").toList();
  auto& own_groups = optimizer.param_groups();
  LF_CHECK(groups.size() == own_groups.size(), ValueError, "load_optimizer_state_dict: the state has ", groups.size(),
           " parameter groups, this ", codec->name, " optimizer has ", own_groups.size(), ".");
  const auto per_parameter = state.at("state").toGenericDict();
  for (size_t g = 0; g < own_groups.size(); ++g) {
    const auto group_dict = groups.get(g).toGenericDict();
    const auto indices = group_dict.at("params").toList();
    const auto& parameters = own_groups[g].params();
    LF_CHECK(indices.size() == parameters.size(), ValueError, "load_optimizer_state_dict: group ", g, " has ",
             indices.size(), " parameters in the state but ", parameters.size(), " here.");
    codec->load_options(own_groups[g].options(), group_dict);
    for (size_t i = 0; i < parameters.size(); ++i) {
      auto found = per_parameter.find(indices.get(i).toInt());
      if (found == per_parameter.end()) {
        optimizer.state().erase(state_key(parameters[i]));
        continue;
      }
      auto restored = codec->load_state(found->value().toGenericDict(), parameters[i]);
      optimizer.state()[state_key(parameters[i])] = std::move(restored);
    }
  }
}

// ---- schedulers ------------------------------------------------------------------------------

namespace {
// The step count is protected in LibTorch's LRScheduler; a derived class may name it.
struct SchedulerAccess : torch::optim::LRScheduler {
  static constexpr unsigned torch::optim::LRScheduler::*step_count = &SchedulerAccess::step_count_;
};
}  // namespace

StateDict scheduler_state_dict(torch::optim::LRScheduler& scheduler) {
  StateDict out = make_state_dict();
  out.insert("_step_count", static_cast<int64_t>(scheduler.*SchedulerAccess::step_count));
  return out;
}

void load_scheduler_state_dict(torch::optim::LRScheduler& scheduler, const StateDict& state) {
  auto found = state.find("_step_count");
  LF_CHECK(found != state.end() && found->value().isInt(), ValueError,
           "load_scheduler_state_dict: expected an integer \"_step_count\".");
  scheduler.*SchedulerAccess::step_count = static_cast<unsigned>(found->value().toInt());
}

// ---- whole states ----------------------------------------------------------------------------

void load_state_dict_into(const StateEntry& target, const StateDict& state, bool strict) {
  LF_CHECK(target.kind() == StateEntry::Kind::Object, ValueError, "load_raw: the target must be a live object (a ",
           "module, optimizer, LR scheduler, loss scaler or your own lf::Stateful), not ", kind_name(target.kind()), ".");
  if (target.module() != nullptr) {
    load_module_state_dict(*target.module(), state, strict);
  } else {
    target.object().load_state_dict(state);
  }
}

namespace {
StateDict filtered(StateDict state, const std::string& key, const StateFilter& filter) {
  auto found = filter.find(key);
  if (found == filter.end()) return state;
  StateDict kept = make_state_dict();
  for (const auto& item : state) {
    if (found->second(item.key().toStringRef(), item.value())) kept.insert(item.key(), item.value());
  }
  return kept;
}
}  // namespace

StateDict to_checkpoint(const State& state, const StateFilter& filter) {
  StateDict out = make_state_dict();
  for (const auto& [key, entry] : state) {
    switch (entry.kind()) {
      case StateEntry::Kind::Object: out.insert(key, filtered(entry.object().state_dict(), key, filter)); break;
      case StateEntry::Kind::Nested: out.insert(key, to_checkpoint(entry.nested())); break;
      case StateEntry::Kind::Value: {
        const c10::IValue& value = entry.value();
        if (value.isGenericDict() && filter.count(key)) {
          out.insert(key, filtered(value.toGenericDict(), key, filter));
        } else {
          out.insert(key, value.isTensor() ? c10::IValue(saved_tensor(value.toTensor())) : value);
        }
        break;
      }
    }
  }
  return out;
}

namespace {
// Files hold plain lists (no type tags: torch.load's weights_only refuses them). A value entry that
// held a typed list, e.g. c10::List<int64_t>, gets its loaded list back with that element type.
c10::IValue with_list_type_of(const c10::IValue& current, const c10::IValue& loaded) {
  if (!current.isList() || !loaded.isList()) return loaded;
  const auto type = current.toList().elementType();
  c10::impl::GenericList typed(type);
  for (const c10::IValue item : loaded.toList()) {
    if (!item.type()->isSubtypeOf(*type)) return loaded;  // not that type after all: keep it as stored
    typed.push_back(item);
  }
  return typed;
}
}  // namespace

// ---- optimizer state by parameter name (optimizer_names.h) ------------------------------------

std::vector<std::string> optimizer_parameter_names(
    torch::optim::Optimizer& optimizer, const std::function<std::optional<std::string>(const at::Tensor&)>& name_of) {
  std::vector<std::string> names;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) {
      const std::optional<std::string> name = name_of(parameter);
      names.push_back(name ? *name : std::to_string(names.size()));
    }
  }
  return names;
}

std::vector<std::string> optimizer_parameter_names(const State& state, torch::optim::Optimizer& optimizer) {
  std::map<const c10::TensorImpl*, std::string> by_tensor;
  for (const auto& [key, entry] : state) {
    if (entry.module() == nullptr) continue;
    // The first name of a shared parameter, as Python's named_parameters gives it.
    for (const auto& parameter : entry.module()->named_parameters(true)) by_tensor.emplace(parameter.value().unsafeGetTensorImpl(), parameter.key());
  }
  return optimizer_parameter_names(optimizer, [&](const at::Tensor& parameter) -> std::optional<std::string> {
    auto found = by_tensor.find(parameter.unsafeGetTensorImpl());
    if (found == by_tensor.end()) return std::nullopt;
    return found->second;
  });
}

bool keys_state_by_name(const StateDict& optimizer_dict) {
  if (!optimizer_dict.contains("state") || !optimizer_dict.at("state").isGenericDict()) return false;
  for (const auto& item : optimizer_dict.at("state").toGenericDict()) {
    if (item.key().isString()) return true;
  }
  return false;
}

StateDict optimizer_state_by_index(const StateDict& named, const std::vector<std::string>& names, const std::string& key,
                                   bool strict) {
  std::map<std::string, int64_t> index_of;
  for (size_t i = 0; i < names.size(); ++i) index_of[names[i]] = static_cast<int64_t>(i);
  // -1: a name no parameter has (refused when strict, dropped otherwise).
  auto index = [&](const std::string& name) -> int64_t {
    auto found = index_of.find(name);
    if (found != index_of.end()) return found->second;
    if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos) return std::stoll(name);
    LF_CHECK(!strict, RuntimeError, "load(strict=true): the checkpoint's '", key, "' holds state of parameter ", name,
             ", which no module in the loaded state has. Load with strict=false to drop it.");
    return -1;
  };
  StateDict out = make_state_dict();
  for (const auto& item : named) out.insert(item.key(), item.value());
  // A folder keeps only leaves, so an optimizer with no state yet (SGD without momentum, or
  // before its first step) comes back without "state" (as in Python's DCP): empty, then.
  c10::impl::GenericDict per_parameter(c10::IntType::get(), c10::AnyType::get());
  if (named.contains("state")) {
    for (const auto& item : named.at("state").toGenericDict()) {
      const int64_t i = item.key().isInt() ? item.key().toInt() : index(item.key().toStringRef());
      if (i >= 0) per_parameter.insert(i, item.value());
    }
  }
  if (named.contains("param_groups")) out.insert_or_assign("state", per_parameter);
  if (named.contains("param_groups")) {
    c10::impl::GenericList groups(c10::AnyType::get());
    for (const c10::IValue group : named.at("param_groups").toList()) {
      StateDict copy = make_state_dict();
      for (const auto& item : group.toGenericDict()) copy.insert(item.key(), item.value());
      if (copy.contains("params")) {
        c10::List<int64_t> indices;
        for (const c10::IValue name : copy.at("params").toList()) {
          const int64_t i = name.isInt() ? name.toInt() : index(name.toStringRef());
          if (i >= 0) indices.push_back(i);
        }
        copy.insert_or_assign("params", indices);
      }
      groups.push_back(copy);
    }
    out.insert_or_assign("param_groups", groups);
  }
  return out;
}

StateDict restore_from_checkpoint(State& state, const StateDict& checkpoint, bool strict, const EntryRestorer& custom) {
  std::string missing;
  for (const auto& [key, entry] : state) {
    if (!checkpoint.contains(key)) missing += (missing.empty() ? "'" : ", '") + key + "'";
  }
  LF_CHECK(!strict || missing.empty(), RuntimeError, "load(strict=true): the checkpoint has no entry for ", missing,
           ". Its keys are listed by fabric.load(path); pass strict=false to restore only what is there.");
  StateDict remainder = make_state_dict();
  for (const auto& item : checkpoint) {
    const std::string& key = item.key().toStringRef();
    auto found = state.find(key);
    if (found == state.end()) {
      remainder.insert(key, item.value());
      continue;
    }
    StateEntry& entry = found->second;
    if (custom && custom(key, entry, item.value())) continue;
    if (entry.kind() == StateEntry::Kind::Value) {
      entry.set_value(with_list_type_of(entry.value(), item.value()));
    } else {
      LF_CHECK(item.value().isGenericDict(), ValueError, "load: checkpoint entry '", key, "' is a ",
               item.value().tagKind(), ", but the state expects ", kind_name(entry.kind()), "'s state dict.");
      if (entry.kind() == StateEntry::Kind::Nested) {
        restore_from_checkpoint(entry.nested(), item.value().toGenericDict(), strict);
      } else if (entry.optimizer() != nullptr && keys_state_by_name(item.value().toGenericDict())) {
        // A consolidated sharded checkpoint, or one from Python FSDP: state by parameter name.
        load_state_dict_into(entry, optimizer_state_by_index(item.value().toGenericDict(),
                                                             optimizer_parameter_names(state, *entry.optimizer()), key, strict),
                             strict);
      } else {
        load_state_dict_into(entry, item.value().toGenericDict(), strict);
      }
    }
  }
  return remainder;
}

}  // namespace lightning::fabric
