#include "lightning/fabric/utilities/throughput.h"

#include <ATen/Context.h>
#include <ATen/record_function.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <type_traits>
#include <mutex>
#include <numeric>
#include <sstream>
#include <utility>
#include <vector>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/fabric.h"

#include "lightning/fabric/utilities/rank_zero.h"
#include "lightning/fabric/utilities/scope_guard.h"
#include "lightning/fabric/wrappers.h"

#ifdef LF_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace lightning::fabric {

// ---- Throughput ----

Throughput::Throughput(ThroughputOptions options) : options_(std::move(options)) {
  LF_CHECK(options_.world_size >= 1, ValueError, "Throughput: world_size=", options_.world_size, " must be at least 1.");
  LF_CHECK(options_.window_size >= 2, ValueError, "Throughput: window_size=", options_.window_size,
           " must be at least 2 (a rate needs two updates; default 100).");
  LF_CHECK(options_.log_every_n_updates >= 0, ValueError, "Throughput: log_every_n_updates=",
           options_.log_every_n_updates, " must be 0 (log when asked) or positive.");
  const double factor = options_.sparse_cuda_acceleration_factor;
  LF_CHECK(std::isfinite(factor) && factor >= 1.0, ValueError, "Throughput: sparse_cuda_acceleration_factor=", factor,
           " is not valid: a sparse acceleration factor cannot reduce the available FLOPs. Give a finite factor of "
           "at least 1 (2.0, the default, for 2:4 structured sparsity).");
  if (!options_.available_flops || !(*options_.available_flops > 0)) return;  // no peak: no MFU to qualify
  if (!options_.using_sparse_model) {
    rank_zero_warn(detail::concat(
        "Throughput: MFU assumes dense model FLOPs: available_flops=", *options_.available_flops,
        " is the dense peak. For a 2:4-sparse model set ThroughputOptions::using_sparse_model = true (the peak is "
        "then multiplied by sparse_cuda_acceleration_factor, default 2.0); set it to false to keep the dense peak "
        "without this warning."));
  } else if (*options_.using_sparse_model) {
    *options_.available_flops *= factor;
  }
}

namespace {
template <class T>
void push_bounded(std::deque<T>& window, T value, int size) {
  window.push_back(value);
  if (static_cast<int>(window.size()) > size) window.pop_front();
}

// Python's _MonotonicWindow: each running total exceeds the window's last value.
template <class T>
void check_increases(const std::deque<T>& window, T value, const char* name) {
  if constexpr (std::is_floating_point_v<T>) {
    LF_CHECK(!std::isnan(value), ValueError, "Throughput::update: ", name, " is NaN; pass the running total since the "
             "start (a finite number).");
  }
  if (window.empty() || value > window.back()) return;
  throw ValueError(detail::concat(
      "Throughput::update: Expected the value to increase, last: ", window.back(), ", current: ", value, " (", name,
      "). time, batches, samples and lengths are running totals since the start, each greater than in the previous "
      "update: pass the elapsed time and counts so far, not per-step values, or call reset() to start over."));
}
}  // namespace

void Throughput::update(const ThroughputUpdate& update) {
  check_increases(time_, update.time, "time");
  check_increases(batches_, update.batches, "batches");
  check_increases(samples_, update.samples, "samples");
  if (update.lengths) check_increases(lengths_, *update.lengths, "lengths");
  LF_CHECK(update.samples >= update.batches, ValueError, "Throughput::update: samples (", update.samples,
           ") must be at least batches (", update.batches, "): both are running totals.");
  if (update.lengths) {
    LF_CHECK(*update.lengths >= update.samples, ValueError, "Throughput::update: lengths (", *update.lengths,
             ") must be at least samples (", update.samples, ").");
    LF_CHECK(lengths_.size() == samples_.size(), ValueError,
             "Throughput::update: lengths given now but not in every earlier update; give them always or never.");
  } else {
    LF_CHECK(lengths_.empty(), ValueError,
             "Throughput::update: lengths were given before but not now; give them always or never.");
  }
  const int size = options_.window_size;
  push_bounded(time_, update.time, size);
  push_bounded(batches_, update.batches, size);
  push_bounded(samples_, update.samples, size);
  if (update.lengths) push_bounded(lengths_, *update.lengths, size);
  if (update.flops) push_bounded(flops_, *update.flops * options_.world_size, size);
}

std::map<std::string, double> Throughput::compute() const {
  std::map<std::string, double> metrics;
  if (time_.empty()) return metrics;
  const std::string device = "device" + options_.separator;
  const auto world = static_cast<double>(options_.world_size);
  const bool totals = options_.world_size > 1;
  metrics["time"] = time_.back();
  metrics["batches"] = static_cast<double>(batches_.back());
  metrics["samples"] = static_cast<double>(samples_.back());
  if (!lengths_.empty()) metrics["lengths"] = static_cast<double>(lengths_.back());
  const auto full = static_cast<size_t>(options_.window_size);
  const double elapsed = time_.back() - time_.front();
  if (time_.size() == full && elapsed > 0) {
    const double batches = static_cast<double>(batches_.back() - batches_.front()) / elapsed;
    const double samples = static_cast<double>(samples_.back() - samples_.front()) / elapsed;
    metrics[device + "batches_per_sec"] = batches;
    metrics[device + "samples_per_sec"] = samples;
    if (totals) {
      metrics["batches_per_sec"] = batches * world;
      metrics["samples_per_sec"] = samples * world;
    }
    if (lengths_.size() == full) {
      const double items = static_cast<double>(lengths_.back() - lengths_.front()) / elapsed;
      metrics[device + "items_per_sec"] = items;
      if (totals) metrics["items_per_sec"] = items * world;
    }
  }
  if (flops_.size() == full && elapsed > 0) {
    // The FLOPs since the window's first update: every entry after the first.
    const double flops = std::accumulate(flops_.begin() + 1, flops_.end(), 0.0);
    const double per_second = flops / elapsed;
    if (totals) metrics["flops_per_sec"] = per_second;
    metrics[device + "flops_per_sec"] = per_second / world;
    if (options_.available_flops && *options_.available_flops > 0) {
      metrics[device + "mfu"] = per_second / world / *options_.available_flops;
    }
  }
  return metrics;
}

void Throughput::reset() {
  time_.clear();
  flops_.clear();
  batches_.clear();
  samples_.clear();
  lengths_.clear();
}

// ---- ThroughputMonitor ----

namespace {
// The dtype the precision computes matrix products in (Python's _plugin_to_compute_dtype).
c10::ScalarType compute_dtype(const Precision& precision) {
  if (const auto* mixed = dynamic_cast<const MixedPrecision*>(&precision)) return mixed->autocast_dtype();
  return precision.module_dtype().value_or(c10::ScalarType::Float);
}

ThroughputOptions for_fabric(const Fabric& fabric, ThroughputOptions options) {
  options.world_size = fabric.world_size();
  if (!options.available_flops) options.available_flops = available_flops(fabric.device(), compute_dtype(*fabric.precision()));
  return options;
}
}  // namespace

ThroughputMonitor::ThroughputMonitor(Fabric& fabric, ThroughputOptions options)
    : Throughput(for_fabric(fabric, std::move(options))), fabric_(fabric) {}

void ThroughputMonitor::update(const ThroughputUpdate& update) {
  Throughput::update(update);
  ++updates_;
  const int every = options().log_every_n_updates;
  if (every > 0 && updates_ % every == 0) compute_and_log();
}

std::map<std::string, double> ThroughputMonitor::compute_and_log(std::optional<int64_t> step) {
  step_ = step.value_or(step_ + 1);
  if (!fabric_.is_global_zero()) return {};
  auto metrics = compute();
  fabric_.log_dict(metrics, step_);
  return metrics;
}

// ---- measure_flops ----

namespace {
// One measurement at a time in the process: its number (from 1) and its count. The callbacks are
// plain function pointers, so they reach the measurement through these.
std::mutex g_measure_mutex;
std::atomic<uint64_t> g_measurement{0};
std::atomic<int64_t> g_counted_flops{0};
thread_local bool t_measuring = false;  // measure_flops is running on this thread

int64_t product(c10::IntArrayRef sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<int64_t>());
}

const at::Tensor* tensor_input(const c10::ArrayRef<c10::IValue>& inputs, size_t index) {
  if (index >= inputs.size() || !inputs[index].isTensor()) return nullptr;
  return &inputs[index].toTensor();
}

// 2 * multiply-adds of a (batched) matrix product a @ b with a [..., m, k] and b [..., k, n].
int64_t matmul_flops(const at::Tensor* a, const at::Tensor* b) {
  if (!a || !b || a->dim() < 2 || b->dim() < 2) return 0;
  return 2 * product(a->sizes()) * b->size(-1);
}

// A convolution's multiply-adds: every output element sums Cin/groups * kernel products. The
// output's spatial size follows from the input's, the kernel's, stride, padding and dilation
// (each one value or one per dimension). For a transposed convolution input and output swap roles:
// every input element is spread over Cout/groups * kernel outputs.
int64_t convolution_flops(const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
                          c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed) {
  const int64_t kernel = product(weight.sizes().slice(2));
  if (transposed) return 2 * input.numel() * weight.size(1) * kernel;  // weight [Cin, Cout/groups, k...]
  const auto at = [](c10::IntArrayRef values, size_t i) { return values.size() == 1 ? values[0] : values[i]; };
  int64_t outputs = input.size(0) * weight.size(0);
  for (size_t d = 0; d + 2 < static_cast<size_t>(input.dim()); ++d) {
    const int64_t extent = input.size(static_cast<int64_t>(d) + 2) + 2 * at(padding, d) -
                           at(dilation, d) * (weight.size(static_cast<int64_t>(d) + 2) - 1) - 1;
    outputs *= extent / at(stride, d) + 1;
  }
  return 2 * outputs * weight.size(1) * kernel;  // weight [Cout, Cin/groups, k...]
}

// The attention kernels: q [B, H, Sq, D], k [B, H, Sk, D]; forward two products (QK^T, PV), backward
// five (QK^T recomputed, then dV, dP, dQ, dK), as Python's FlopCounterMode counts them.
int64_t attention_flops(const at::Tensor* q, const at::Tensor* k, int products) {
  if (!q || !k || q->dim() != 4 || k->dim() != 4) return 0;
  return products * 2 * q->size(0) * q->size(1) * q->size(2) * k->size(2) * q->size(3);
}

// The operators counted, by how their FLOPs are read from the inputs.
enum class Counted { None, Matmul, AddMatmul, Convolution, ConvolutionBackward, Attention, AttentionBackward };

Counted counted_kind(std::string_view name) {
  if (name == "aten::mm" || name == "aten::bmm") return Counted::Matmul;
  if (name == "aten::addmm" || name == "aten::baddbmm") return Counted::AddMatmul;
  if (name == "aten::convolution") return Counted::Convolution;
  if (name == "aten::convolution_backward") return Counted::ConvolutionBackward;
  if (name == "aten::_scaled_dot_product_flash_attention" || name == "aten::_scaled_dot_product_efficient_attention" ||
      name == "aten::_scaled_dot_product_cudnn_attention" || name == "aten::_scaled_dot_product_flash_attention_for_cpu") {
    return Counted::Attention;
  }
  if (name == "aten::_scaled_dot_product_flash_attention_backward" ||
      name == "aten::_scaled_dot_product_efficient_attention_backward" ||
      name == "aten::_scaled_dot_product_cudnn_attention_backward" ||
      name == "aten::_scaled_dot_product_flash_attention_for_cpu_backward") {
    return Counted::AttentionBackward;
  }
  return Counted::None;
}

int64_t flops_of(const at::RecordFunction& call, Counted kind) {
  const auto inputs = call.inputs();
  switch (kind) {
    case Counted::None: return 0;
    case Counted::Matmul: return matmul_flops(tensor_input(inputs, 0), tensor_input(inputs, 1));
    case Counted::AddMatmul: return matmul_flops(tensor_input(inputs, 1), tensor_input(inputs, 2));
    case Counted::Convolution:
    case Counted::ConvolutionBackward: {
      // convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
      // convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
      // transposed, output_padding, groups, output_mask): grad_input and grad_weight cost one
      // forward's products each.
      const bool backward = kind == Counted::ConvolutionBackward;
      const size_t first = backward ? 1 : 0;
      const auto* input = tensor_input(inputs, first);
      const auto* weight = tensor_input(inputs, first + 1);
      if (!input || !weight || inputs.size() < (backward ? 11u : 9u)) return 0;
      const int64_t one = convolution_flops(*input, *weight, inputs[first + 3].toIntVector(),
                                            inputs[first + 4].toIntVector(), inputs[first + 5].toIntVector(),
                                            inputs[first + 6].toBool());
      if (!backward) return one;
      const auto mask = inputs[10].toBoolList();
      return one * ((mask.size() > 0 && mask[0]) + (mask.size() > 1 && mask[1]));
    }
    case Counted::Attention: return attention_flops(tensor_input(inputs, 0), tensor_input(inputs, 1), 2);
    case Counted::AttentionBackward:  // (grad_out, q, k, v, ...)
      return attention_flops(tensor_input(inputs, 1), tensor_input(inputs, 2), 5);
  }
  return 0;
}

// Counted operators running on this thread. A counted operator called from inside another is not
// counted again: autocast re-dispatches an addmm as an addmm of the cast inputs, and a kernel may
// call another (a convolution's matrix products); the outermost call holds the whole count.
// The depth belongs to one measurement (t_depth_measurement): a thread's first callback in a new
// measurement starts it from 0, so whatever an earlier measurement left on any thread (an
// exception, an operator whose end never ran) cannot silence this one's products.
thread_local int t_counted_depth = 0;
thread_local uint64_t t_depth_measurement = 0;

void join_measurement() {
  const uint64_t current = g_measurement.load();
  if (t_depth_measurement == current) return;
  t_depth_measurement = current;
  t_counted_depth = 0;
}

// Inputs are readable in the start callback only.
std::unique_ptr<at::ObserverContext> count_start(const at::RecordFunction& call) {
  join_measurement();
  const Counted kind = counted_kind(call.name());
  if (kind != Counted::None && t_counted_depth++ == 0) g_counted_flops += flops_of(call, kind);
  return nullptr;
}

void count_end(const at::RecordFunction& call, at::ObserverContext*) {
  join_measurement();
  if (counted_kind(call.name()) != Counted::None && t_counted_depth > 0) --t_counted_depth;
}
}  // namespace

int64_t measure_flops(torch::nn::Module& model, const std::function<at::Tensor()>& forward_fn,
                      const std::function<at::Tensor(const at::Tensor&)>& loss_fn) {
  LF_CHECK(forward_fn != nullptr, ValueError, "measure_flops: forward_fn is empty.");
  LF_CHECK(!t_measuring, RuntimeError, "measure_flops was called from inside another measure_flops on this thread "
           "(its forward_fn or loss_fn). Measure once, from outside: the outer count already includes everything "
           "its functions run.");
  std::lock_guard<std::mutex> one_at_a_time(g_measure_mutex);
  t_measuring = true;
  ScopeGuard done([] { t_measuring = false; });
  g_measurement.fetch_add(1);
  g_counted_flops = 0;
  // A thread-local callback: it sees this thread's operators, and the autograd engine carries it to
  // the threads that run this thread's backward (with the rest of the thread-local state), so the
  // backward on a GPU's autograd thread counts while other threads' work does not.
  const auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(count_start, count_end)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  ScopeGuard remove([handle] { at::removeCallback(handle); });
  if (loss_fn) {
    // The model's own gradients are set aside and put back: the count's backward neither adds to
    // them nor leaves its own.
    auto parameters = model.parameters();
    std::vector<at::Tensor> kept;
    for (auto& parameter : parameters) kept.push_back(std::exchange(parameter.mutable_grad(), at::Tensor()));
    ScopeGuard restore([&] {
      for (size_t i = 0; i < parameters.size(); ++i) parameters[i].mutable_grad() = kept[i];
    });
    at::Tensor loss = loss_fn(forward_fn());
    // The outputs of a set-up model accept only a backward that Fabric runs (wrappers.h); this
    // one is the count's own, plain: no gradient synchronisation (ddp averages only inside
    // fabric.backward), no loss scaling, and its gradients are dropped above.
    detail::BackwardScope counted_backward;
    loss.backward();
  } else {
    torch::NoGradGuard no_grad;
    forward_fn();
  }
  if (torch::cuda::is_available()) torch::cuda::synchronize();
  return g_counted_flops.load();
}

// ---- available_flops ----

namespace {
// Dense peak FLOP/s per GPU (the data sheets' tensor-core figures "with sparsity" halved).
// Sources: NVIDIA A100 Tensor Core GPU data sheet (nvidia-a100-datasheet-us-nvidia-1758950-r4);
// NVIDIA H100 Tensor Core GPU data sheet (SXM, PCIe and NVL columns); NVIDIA H200 Tensor Core
// GPU data sheet (H200 SXM has H100 SXM's compute; H200 NVL the H100 NVL's); NVIDIA HGX B200
// specifications (per-GPU = the 8-GPU board's figures / 8).
struct PeakFlops {
  const char* chip;
  double fp32, tf32, bf16, fp16, fp64;
};
constexpr PeakFlops kPeakFlops[] = {
    {"b200", 75e12, 1.1e15, 2.25e15, 2.25e15, 37e12},
    {"h200 nvl", 60e12, 417.5e12, 835.5e12, 835.5e12, 30e12},
    {"h200", 66.9e12, 494.7e12, 989.4e12, 989.4e12, 33.5e12},
    {"h100 nvl", 60e12, 417.5e12, 835.5e12, 835.5e12, 30e12},
    {"h100 pcie", 51.2e12, 378e12, 756e12, 756e12, 25.6e12},
    {"h100", 66.9e12, 494.7e12, 989.4e12, 989.4e12, 33.5e12},  // SXM ("NVIDIA H100 80GB HBM3")
    {"a100", 19.5e12, 156e12, 312e12, 312e12, 9.7e12},
};

// The table's chip for a driver-reported name: lower case, an H100 PCIe named by "pcie" or "hbm2e".
std::optional<PeakFlops> chip_of(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has("h100") && has("hbm2e")) name += " pcie";
  for (const auto& entry : kPeakFlops) {
    std::string chip = entry.chip;
    const auto space = chip.find(' ');
    const bool matches = space == std::string::npos ? has(chip.c_str())
                                                    : has(chip.substr(0, space).c_str()) && has(chip.substr(space + 1).c_str());
    if (matches) return entry;
  }
  return std::nullopt;
}
}  // namespace

namespace {
// The dtype as Python prints it (torch.bfloat16), for messages that read as Python's.
std::string python_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::BFloat16: return "torch.bfloat16";
    case c10::ScalarType::Half: return "torch.float16";
    case c10::ScalarType::Float: return "torch.float32";
    case c10::ScalarType::Double: return "torch.float64";
    case c10::ScalarType::Char: return "torch.int8";
    case c10::ScalarType::Byte: return "torch.uint8";
    case c10::ScalarType::Int: return "torch.int32";
    case c10::ScalarType::Long: return "torch.int64";
    default: return c10::toString(dtype);
  }
}
}  // namespace

std::optional<double> available_flops(const std::string& device_name, c10::ScalarType dtype, bool tf32) {
  const auto chip = chip_of(device_name);
  if (!chip) {
    rank_zero_warn("FLOPs not found for '" + device_name + "': available_flops knows A100, H100 (SXM, PCIe, NVL), "
                   "H200 (SXM, NVL) and B200. No MFU is reported; measure this device's peak and pass "
                   "ThroughputOptions::available_flops for one.");
    return std::nullopt;
  }
  switch (dtype) {
    case c10::ScalarType::BFloat16: return chip->bf16;
    case c10::ScalarType::Half: return chip->fp16;
    case c10::ScalarType::Float: return tf32 ? chip->tf32 : chip->fp32;
    case c10::ScalarType::Double: return chip->fp64;
    default:
      rank_zero_warn("'" + device_name + "' does not support " + python_dtype_name(dtype) +
                     " in available_flops' table (bfloat16, float16, float32 or TF32, float64). No MFU is reported; "
                     "pass ThroughputOptions::available_flops for one.");
      return std::nullopt;
  }
}

std::optional<double> available_flops(const c10::Device& device, c10::ScalarType dtype) {
  if (!device.is_cuda()) return std::nullopt;
#ifdef LF_TORCH_HAS_CUDA
  const auto* properties = at::cuda::getDeviceProperties(device.has_index() ? device.index() : c10::cuda::current_device());
  if (properties == nullptr) return std::nullopt;
  return available_flops(std::string(properties->name), dtype, at::globalContext().allowTF32CuBLAS());
#else
  (void)dtype;
  return std::nullopt;
#endif
}

}  // namespace lightning::fabric
