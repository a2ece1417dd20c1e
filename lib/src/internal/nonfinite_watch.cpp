#include "lightning/fabric/internal/nonfinite_watch.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/fabric.h"
#include "lightning/fabric/utilities/nonfinite.h"

namespace lightning::fabric {

namespace detail {
ScopeGuard watch_forward_for_nonfinite(torch::nn::Module& module) {
  internal::NonFiniteWatch* watch = internal::NonFiniteWatch::active();
  return watch == nullptr ? ScopeGuard() : watch->observe(module);
}
}  // namespace detail

namespace internal {
namespace {

std::atomic<NonFiniteWatch*> process_watch{nullptr};
constexpr int64_t kDescriptionBytes = 1024;  // per rank, in the gathered findings
constexpr size_t kMaxEvents = 1 << 16;       // then only the first non-finite ones are kept (one read)

struct OpContext : at::ObserverContext {
  std::string module;       // the module whose parameter (or its cast) this operation read; "" if none
  bool cast_of_a_parameter = false;  // its only tensor input is labelled: its outputs inherit the label
};

bool watched_tensor(const at::Tensor& tensor) {
  return tensor.defined() && tensor.numel() > 0 && (tensor.is_floating_point() || tensor.is_complex());
}

// The module path of a parameter name ("blocks.0.fc1.weight" -> "blocks.0.fc1"; "weight" -> the root).
std::string module_path_of(const std::string& parameter, const std::string& root) {
  const auto dot = parameter.rfind('.');
  return dot == std::string::npos ? root : parameter.substr(0, dot);
}

// A 0-dim double on the tensor's device: its sum, which is inf or NaN when some element is (and
// when finite values add up beyond the float range: values near 1e38, an overflow about to
// happen). One reduction, no synchronisation. Complex tensors: the sum's magnitude.
at::Tensor nonfinite_probe(const at::Tensor& tensor) {
  const bool reduced_precision = tensor.scalar_type() == at::kHalf || tensor.scalar_type() == at::kBFloat16;
  at::Tensor total = reduced_precision ? at::sum(tensor, at::kFloat) : at::sum(tensor);
  if (total.is_complex()) total = total.abs();
  return total.to(at::kDouble);
}

// The probes' values on the CPU: one copy per device, not one per probe.
std::vector<double> probe_values(const std::vector<at::Tensor>& probes) {
  std::vector<double> values(probes.size());
  std::map<std::string, std::vector<size_t>> by_device;
  for (size_t i = 0; i < probes.size(); ++i) by_device[probes[i].device().str()].push_back(i);
  for (const auto& [device, indices] : by_device) {
    std::vector<at::Tensor> same;
    same.reserve(indices.size());
    for (size_t i : indices) same.push_back(probes[i]);
    const at::Tensor host = at::stack(same).cpu();
    const double* data = host.data_ptr<double>();
    for (size_t k = 0; k < indices.size(); ++k) values[indices[k]] = data[k];
  }
  return values;
}

// A forward output's kind of non-finite value: 2 for NaN or +inf (an overflow, an invalid
// operation), 1 for -inf alone (often a mask, as attention's), 0 for finite.
int nonfinite_kind(double total) {
  if (std::isfinite(total)) return 0;
  return std::isinf(total) && total < 0 ? 1 : 2;
}

std::string finding_text(const at::Tensor& bytes) {
  const auto* data = bytes.data_ptr<uint8_t>();
  return std::string(reinterpret_cast<const char*>(data), strnlen(reinterpret_cast<const char*>(data), bytes.numel()));
}

}  // namespace

NonFiniteWatch::NonFiniteWatch() {
  NonFiniteWatch* expected = nullptr;
  LF_CHECK(process_watch.compare_exchange_strong(expected, this), RuntimeError,
           "FabricOptions::detect_nonfinite: another Fabric of this process has it on already; one Fabric per process "
           "can, since it observes every set-up module's forward. Turn it off there, or destroy that Fabric first.");
}

NonFiniteWatch::~NonFiniteWatch() {
  if (handle_ != 0) at::removeCallback(handle_);
  process_watch.store(nullptr);
}

NonFiniteWatch* NonFiniteWatch::active() { return process_watch.load(std::memory_order_relaxed); }

ScopeGuard NonFiniteWatch::observe(torch::nn::Module& module) {
  if (depth_++ == 0) {
    labels_.clear();
    last_module_.clear();
    const std::string root = module.name();
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      labels_[item.value().unsafeGetTensorImpl()] = module_path_of(item.key(), root);
    }
    hook_gradients(module);
    handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&NonFiniteWatch::on_start, &NonFiniteWatch::on_end)
                                             .needsInputs(true)
                                             .needsOutputs(true)
                                             .scopes({at::RecordScope::FUNCTION}));
  }
  return ScopeGuard([this] {
    if (--depth_ == 0 && handle_ != 0) {
      at::removeCallback(handle_);
      handle_ = 0;
    }
  });
}

void NonFiniteWatch::hook_gradients(torch::nn::Module& module) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& parameter = item.value();
    if (!parameter.requires_grad()) continue;
    auto known = hooked_.find(parameter.unsafeGetTensorImpl());
    if (known != hooked_.end() && !known->second.expired()) continue;  // (a freed tensor's address may be reused)
    parameter.register_hook([name = item.key()](const at::Tensor& gradient) {
      if (NonFiniteWatch* watch = active()) watch->record_gradient(name, gradient);
    });
    hooked_.insert_or_assign(parameter.unsafeGetTensorImpl(), parameter.getIntrusivePtr());
  }
}

void NonFiniteWatch::record_gradient(const std::string& parameter, const at::Tensor& gradient) {
  if (!watched_tensor(gradient)) return;
  at::RecordFunctionGuard not_observed(false);
  at::NoGradGuard no_grad;
  at::Tensor probe = nonfinite_probe(gradient);
  std::lock_guard<std::mutex> lock(gradients_mutex_);
  if (gradient_events_.size() < kMaxEvents) gradient_events_.push_back({std::move(probe), parameter});
}

void NonFiniteWatch::before_backward() {
  std::lock_guard<std::mutex> lock(gradients_mutex_);
  gradient_events_.clear();
}

std::unique_ptr<at::ObserverContext> NonFiniteWatch::on_start(const at::RecordFunction& fn) {
  NonFiniteWatch* watch = active();
  if (watch == nullptr || !at::GradMode::is_enabled()) return nullptr;
  // Factories of uninitialised memory (empty, empty_like, new_empty, empty_strided, ...): their
  // outputs hold whatever bits were there until an operation fills them.
  if (std::strstr(fn.name(), "empty") != nullptr) return nullptr;
  auto context = std::make_unique<OpContext>();
  int tensors = 0;
  for (const c10::IValue& input : fn.inputs()) {
    if (!input.isTensor()) continue;
    ++tensors;
    auto found = watch->labels_.find(input.toTensor().unsafeGetTensorImpl());
    if (found != watch->labels_.end() && context->module.empty()) context->module = found->second;
  }
  context->cast_of_a_parameter = tensors == 1 && !context->module.empty();
  return context;
}

void NonFiniteWatch::on_end(const at::RecordFunction& fn, at::ObserverContext* raw) {
  NonFiniteWatch* watch = active();
  auto* context = static_cast<OpContext*>(raw);
  if (watch == nullptr || context == nullptr) return;
  at::RecordFunctionGuard not_observed(false);  // the checks below are not operations of the model
  at::NoGradGuard no_grad;
  const std::string where = !context->module.empty() ? "module '" + context->module + "'"
                            : !watch->last_module_.empty()
                                ? "after module '" + watch->last_module_ + "' (the last whose parameters were read)"
                                : "before any parameter was read (the forward's inputs)";
  for (const c10::IValue& output : fn.outputs()) {
    if (!output.isTensor() || !watched_tensor(output.toTensor())) continue;
    const at::Tensor& tensor = output.toTensor();
    watch->events_.push_back({nonfinite_probe(tensor), fn.name(), where});
    if (context->cast_of_a_parameter) watch->labels_[tensor.unsafeGetTensorImpl()] = context->module;
  }
  if (!context->module.empty()) watch->last_module_ = context->module;
  if (watch->events_.size() > kMaxEvents) watch->keep_first_nonfinite_events();
}

void NonFiniteWatch::keep_first_nonfinite_events() {
  std::vector<at::Tensor> probes;
  probes.reserve(events_.size());
  for (const auto& event : events_) probes.push_back(event.bad);
  const std::vector<double> totals = probe_values(probes);
  std::vector<Event> kept;
  bool weak = false, strong = false;
  for (size_t i = 0; i < events_.size(); ++i) {
    const int kind = nonfinite_kind(totals[i]);
    if ((kind == 1 && !weak) || (kind == 2 && !strong)) kept.push_back(events_[i]);
    weak = weak || kind == 1;
    strong = strong || kind == 2;
  }
  events_ = std::move(kept);
}

std::string NonFiniteWatch::local_finding(const at::Tensor& loss, const NamedGradients& gradients, bool check_gradients,
                                          bool& origin) {
  at::RecordFunctionGuard not_observed(false);
  at::NoGradGuard no_grad;
  std::vector<Event> events = std::move(events_);
  events_.clear();
  std::vector<GradientEvent> produced;
  {
    std::lock_guard<std::mutex> lock(gradients_mutex_);
    produced = std::move(gradient_events_);
    gradient_events_.clear();
  }
  origin = false;
  // Forward outputs count only when the loss is not finite: a -inf mask (attention's) or a NaN
  // that a later operation drops is no finding while the loss stays finite.
  std::vector<at::Tensor> event_probes;
  event_probes.reserve(events.size());
  for (const auto& event : events) event_probes.push_back(event.bad);
  if (loss.defined() && watched_tensor(loss) && !std::isfinite(probe_values({nonfinite_probe(loss)})[0])) {
    origin = true;
    const std::vector<double> totals = probe_values(event_probes);
    const Event* first_weak = nullptr;
    for (size_t i = 0; i < events.size(); ++i) {
      const int kind = nonfinite_kind(totals[i]);
      if (kind == 2) return "the output of " + events[i].op + ", in the forward, " + events[i].module;
      if (kind == 1 && first_weak == nullptr) first_weak = &events[i];
    }
    if (first_weak != nullptr) {
      return "the output of " + first_weak->op + " (-inf only), in the forward, " + first_weak->module;
    }
    return "the loss, while every operation of the set-up modules' forward gave finite values (it came from the loss "
           "computation or from outside the modules)";
  }
  if (!check_gradients) return "";
  // This rank's own gradients, in the order the backward produced them, before any reduction.
  std::vector<at::Tensor> produced_probes;
  produced_probes.reserve(produced.size());
  for (const auto& event : produced) produced_probes.push_back(event.bad);
  const std::vector<double> produced_totals = probe_values(produced_probes);
  const GradientEvent* first_gradient = nullptr;
  for (size_t i = 0; i < produced.size() && first_gradient == nullptr; ++i) {
    if (!std::isfinite(produced_totals[i])) first_gradient = &produced[i];
  }
  std::vector<std::string> names;  // in backward order (last registered first)
  std::vector<at::Tensor> probes;
  for (auto item = gradients.rbegin(); item != gradients.rend(); ++item) {
    if (!watched_tensor(item->second)) continue;
    names.push_back(item->first);
    probes.push_back(nonfinite_probe(item->second));
  }
  const std::vector<double> totals = probe_values(probes);
  std::string listed;
  size_t count = 0;
  for (size_t i = 0; i < totals.size(); ++i) {
    if (std::isfinite(totals[i])) continue;
    if (++count <= 8) listed += (listed.empty() ? "" : ", ") + names[i];
  }
  if (count == 0 && first_gradient == nullptr) return "";
  if (count > 8) listed += ", ... (" + std::to_string(count) + " in all)";
  if (first_gradient == nullptr) {  // every gradient this rank produced was finite: the reduction brought it
    return "the gradients of " + listed + " (in backward order), while the loss was finite and no forward output "
           "held NaN or +inf";
  }
  origin = true;
  // A NaN or +inf in the forward that the loss did not see (a branch torch::where dropped) still
  // reaches the gradients (0 x NaN): it is then where this began.
  const std::vector<double> forward_totals = probe_values(event_probes);
  for (size_t i = 0; i < events.size(); ++i) {
    if (nonfinite_kind(forward_totals[i]) != 2) continue;
    return "the output of " + events[i].op + ", in the forward, " + events[i].module + "; the loss stayed finite and " +
           "the gradient of '" + first_gradient->parameter + "' did not";
  }
  return "the gradient of '" + first_gradient->parameter + "', in the backward, module '" +
         module_path_of(first_gradient->parameter, "(the root module)") + "' (the first non-finite gradient this rank " +
         "produced, before the gradient reduction), while the loss and every forward output were finite";
}

void NonFiniteWatch::after_backward(Fabric& fabric, const at::Tensor& loss, const NamedGradients& gradients,
                                    bool check_gradients) {
  const int64_t step = step_++;
  bool began_here = false;
  std::string mine = local_finding(loss, gradients, check_gradients, began_here);
  if (mine.size() >= static_cast<size_t>(kDescriptionBytes) - 1) mine.resize(kDescriptionBytes - 2);
  at::Tensor row = at::zeros({kDescriptionBytes}, at::kByte);
  row[0] = began_here ? 1 : 0;
  std::memcpy(row.data_ptr<uint8_t>() + 1, mine.data(), mine.size());
  const int world = fabric.world_size();
  at::Tensor all = world == 1 ? row.unsqueeze(0) : fabric.all_gather(row.to(fabric.device())).cpu();
  std::vector<int> origin;
  std::vector<std::pair<int, std::string>> findings;
  for (int rank = 0; rank < world; ++rank) {
    const std::string text = finding_text(all[rank].narrow(0, 1, kDescriptionBytes - 1).contiguous());
    if (text.empty()) continue;
    if (all[rank][0].item<uint8_t>() != 0) origin.push_back(rank);
    findings.emplace_back(rank, text);
  }
  if (findings.empty()) return;
  // With an origin, the other ranks' non-finite gradients are its echo through the gradient reduction.
  std::string found, echoes;
  for (const auto& [rank, text] : findings) {
    const bool is_origin = std::find(origin.begin(), origin.end(), rank) != origin.end();
    if (origin.empty() || is_origin) {
      found += "\n  rank " + std::to_string(rank) + ": " + text;
    } else {
      echoes += (echoes.empty() ? "" : ", ") + std::to_string(rank);
    }
  }
  if (!echoes.empty()) found += "\n  (rank " + echoes + ": non-finite gradients, received through the gradient reduction)";
  std::string ranks;
  for (int rank : origin) ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
  throw NonFiniteError("fabric.backward at step " + std::to_string(step) + " (FabricOptions::detect_nonfinite): " +
                           (origin.empty() ? std::string("non-finite gradients after the gradient reduction")
                                           : "the first non-finite value appeared on rank " + ranks) +
                           "; where each rank saw one first:" + found,
                       step, origin);
}

}  // namespace internal
}  // namespace lightning::fabric
