// The optimizer half of a captured step (CapturedStep): fused optimizer steps whose learning
// rates and step counters live in device tensors, so that replaying the recorded kernels performs
// the next step. Eager calls work on every device (the CPU tests drive them without a graph).
#pragma once

#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace lightning::fabric::internal {

/// Device-resident inputs of one optimizer's fused steps. Made by prepare_device_step (outside any
/// capture); the recorded step reads them.
struct DeviceStepInputs {
  std::vector<at::Tensor> learning_rates;  // one float32 scalar per parameter group
  // (group, device, dtype) -> the bucket's float32 step tensor, incremented on the device by every
  // recorded step. Its parameters share one host counter (prepare_device_step checks).
  std::map<std::tuple<size_t, std::string, int>, at::Tensor> steps;
  // What advances the host counters of the parameters the recorded step updates (set by
  // queue_device_step): called once per replay, so optimizer->state() and checkpoints stay right.
  std::vector<std::function<void()>> advance_host_counters;
};

/// Creates (first call) or refreshes the inputs: every group's learning rate is copied from its
/// options (a scheduler's change reaches the next replay). Step tensors are made from the host
/// counters of parameters that have state; ValueError when the parameters of one group, device and
/// dtype have different counters (some missed a gradient in the warm-up). Not captured;
/// precondition: why_not_fused is nullopt.
void prepare_device_step(torch::optim::Optimizer& optimizer, DeviceStepInputs& inputs);

/// Queues one fused step reading inputs: every step tensor in use is incremented first, then one
/// kernel per bucket with the tensor learning rate. Capturable: it allocates nothing and reads
/// nothing back. RuntimeError when a parameter with a gradient has no state or no prepared step
/// tensor (its first gradient arrived after the warm-up), since that state would be made inside
/// the graph and reset by every replay.
void queue_device_step(torch::optim::Optimizer& optimizer, DeviceStepInputs& inputs);

}  // namespace lightning::fabric::internal
