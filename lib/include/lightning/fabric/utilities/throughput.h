// Throughput and model FLOPs utilisation (MFU), with the quantities and metric names of Python
// Lightning Fabric's lightning.fabric.utilities.throughput:
//
//   lf::ThroughputMonitor monitor(fabric);                 // MFU against the device's peak
//   const int64_t flops = lf::measure_flops(*net, [&] { return net->forward(x); },
//                                           [](const torch::Tensor& y) { return y.sum(); });
//   for (int64_t i = 1; ...; ++i) {
//     train_step();                                         // on CUDA: synchronise before timing
//     monitor.update({seconds_since_start, i, i * batch_size, i * batch_size * seq, flops});
//     if (i % 10 == 0) monitor.compute_and_log();          // fabric.log_dict on rank 0
//   }
//
// Metrics (rolling over window_size updates; per-second values appear once the window is full):
// device/batches_per_sec, device/samples_per_sec, device/items_per_sec, device/flops_per_sec,
// device/mfu, and with world_size > 1 the totals batches_per_sec, samples_per_sec,
// items_per_sec, flops_per_sec; always time, batches, samples and (if given) lengths.
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace lightning::fabric {

class Fabric;
template <class ModuleImpl>
class FabricModule;

struct LF_API ThroughputOptions {
  /// Peak FLOP/s of one device, for MFU (unset: no MFU). ThroughputMonitor fills it from
  /// available_flops unless given.
  std::optional<double> available_flops;
  /// Devices across hosts; totals are reported only above 1. ThroughputMonitor takes fabric's.
  int world_size = 1;
  /// Updates the rolling averages span (at least 2).
  int window_size = 100;
  /// Between "device" and the metric name.
  std::string separator = "/";
  /// ThroughputMonitor: compute_and_log() after every this many updates (0, the default: only
  /// when you call it, as Python's ThroughputMonitor).
  int log_every_n_updates = 0;
  /// Whether the model's matrix products run 2:4-sparse (Python's using_sparse_model). true:
  /// available_flops (given or looked up) is multiplied by sparse_cuda_acceleration_factor, so
  /// MFU is measured against the sparse peak; false: the dense peak. Unset (the default): the
  /// dense peak, with a warning when available_flops is known, since MFU is ambiguous for a
  /// sparse model. options().available_flops is the peak after scaling.
  std::optional<bool> using_sparse_model;
  /// The peak's gain from sparse products when using_sparse_model is true (default 2.0, the data
  /// sheets' 2:4 factor). At least 1: sparsity cannot lower the peak.
  double sparse_cuda_acceleration_factor = 2.0;
};

/// One update: running totals on this device since the start. time, batches, samples and lengths
/// each increase from one update to the next (as Python's monotonic window requires).
struct LF_API ThroughputUpdate {
  double time = 0;       // seconds elapsed
  int64_t batches = 0;   // batches seen
  int64_t samples = 0;   // samples seen (>= batches)
  std::optional<int64_t> lengths;  // items (tokens) seen (>= samples)
  std::optional<double> flops;     // FLOPs of this device since the previous update
};

class LF_API Throughput {
 public:
  /// ValueError for world_size < 1, window_size < 2 or sparse_cuda_acceleration_factor < 1.
  /// Scales available_flops when using_sparse_model is true; warns (rank_zero_warn) when it is
  /// unset and available_flops is known.
  explicit Throughput(ThroughputOptions options = {});
  virtual ~Throughput() = default;

  /// ValueError when time, batches, samples or lengths does not increase on the previous update
  /// (Python: "Expected the value to increase"), when samples < batches or lengths < samples, or
  /// when lengths are given in some updates and not in others. A refused update changes nothing.
  void update(const ThroughputUpdate& update);
  /// The metrics named above.
  std::map<std::string, double> compute() const;
  /// Empties every window: the next update may start the totals again.
  void reset();
  const ThroughputOptions& options() const { return options_; }

 private:
  ThroughputOptions options_;
  std::deque<double> time_, flops_;
  std::deque<int64_t> batches_, samples_, lengths_;
};

/// Throughput for a Fabric: world_size is fabric.world_size(), available_flops (unless given)
/// is available_flops(fabric.device(), the precision's compute dtype). update and compute work on
/// every rank (each rank's own numbers); logging happens on rank 0 only. The Fabric must outlive it.
class LF_API ThroughputMonitor : public Throughput {
 public:
  explicit ThroughputMonitor(Fabric& fabric, ThroughputOptions options = {});
  /// Throughput::update, then compute_and_log() every log_every_n_updates updates.
  void update(const ThroughputUpdate& update);
  /// compute(), logged through fabric.log_dict at step (default: one more than the last call,
  /// starting at 0); returns the metrics (empty on ranks other than 0).
  std::map<std::string, double> compute_and_log(std::optional<int64_t> step = std::nullopt);

 private:
  Fabric& fabric_;
  int64_t step_ = -1;
  int64_t updates_ = 0;
};

/// The FLOPs of forward_fn() and, when loss_fn is given, of loss_fn(output).backward(), counted
/// analytically from the shapes of the matrix products and convolutions that run (aten::mm, addmm,
/// bmm, baddbmm, convolution, convolution_backward, and the flash, memory-efficient and cuDNN
/// attention kernels forward and backward): 2 FLOPs per multiply-add, as Python's FlopCounterMode
/// counts them (also the attention backward's five products). Elementwise operations,
/// normalisations and softmax are not counted. model is the module forward_fn runs: its gradients
/// are set aside during the count and put back after it. Runs the passes for real. Counts the
/// products of the calling thread and of the autograd threads running its backward, not those of
/// other threads; one measurement runs at a time in the process (a concurrent call waits; a call
/// from inside forward_fn or loss_fn is refused with RuntimeError).
/// A set-up model works too (below): its forward runs as in training (device, precision), and
/// the backward is the count's own plain one (no gradient synchronisation, no loss scaling), which
/// its outputs then accept. Under ddp and fsdp a set-up model's forward is collective (call it on
/// every rank); under fsdp count on the raw module before setup, whose parameters are whole.
LF_API int64_t measure_flops(torch::nn::Module& model, const std::function<at::Tensor()>& forward_fn,
                             const std::function<at::Tensor(const at::Tensor&)>& loss_fn = nullptr);
/// measure_flops on a set-up model (Python passes the _FabricModule the same way):
///   auto model = fabric.setup(net);
///   lf::measure_flops(model, [&] { return model(x); }, [](const torch::Tensor& y) { return y.sum(); });
template <class ModuleImpl>
int64_t measure_flops(const FabricModule<ModuleImpl>& model, const std::function<at::Tensor()>& forward_fn,
                      const std::function<at::Tensor(const at::Tensor&)>& loss_fn = nullptr) {
  torch::nn::Module& module = *model;
  return measure_flops(module, forward_fn, loss_fn);
}

/// The dense (not sparsity-doubled) peak FLOP/s of one device for dtype, from the vendor's data
/// sheet, or nullopt when unknown: no table for CPUs (measure your own peak and pass
/// ThroughputOptions::available_flops). float32 on a GPU counts as TF32 when float32 matrix products
/// may use TF32 (at::globalContext().allowTF32CuBLAS()). A GPU not in the table, or a dtype the
/// table has no figure for, gives nullopt with a warning (rank_zero_warn), as Python's
/// get_available_flops; a CPU gives nullopt silently.
LF_API std::optional<double> available_flops(const c10::Device& device, c10::ScalarType dtype);
/// The same for a CUDA device name as the driver reports it (e.g. "NVIDIA H200"); "tf32" selects
/// TF32 for float32. Warns as above for an unknown name or dtype.
LF_API std::optional<double> available_flops(const std::string& device_name, c10::ScalarType dtype, bool tf32 = false);

}  // namespace lightning::fabric
