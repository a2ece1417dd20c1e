// Accelerators: the hardware a process computes on. Built-ins: cpu and cuda (cuda is always
// compiled; it is available only with a CUDA LibTorch and a visible GPU). "gpu" and "auto" are
// names the Connector resolves before it asks the registry.
#pragma once

#include "lightning/fabric/export.h"

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "lightning/fabric/registry.h"
#include "lightning/fabric/utilities/devices.h"

namespace lightning::fabric {

class LF_API Accelerator {
 public:
  virtual ~Accelerator() = default;
  virtual std::string name() const = 0;
  virtual bool is_available() const = 0;
  /// Devices visible to this process (GPUs) or 1 (CPU).
  virtual int auto_device_count() const = 0;
  /// Turns the user's devices setting into device indices (CPU: 0..n-1 of n processes).
  virtual std::vector<int> parse_devices(const DevicesSpec& spec) const = 0;
  /// The device a process with this index computes on.
  virtual torch::Device device_for(int index) const = 0;
  /// Called once per process before the model is set up (e.g. selects the current CUDA device).
  virtual void setup_device(const torch::Device& device) const { (void)device; }
};

class LF_API CPUAccelerator : public Accelerator {
 public:
  std::string name() const override { return "cpu"; }
  bool is_available() const override { return true; }
  int auto_device_count() const override { return 1; }
  std::vector<int> parse_devices(const DevicesSpec& spec) const override;
  torch::Device device_for(int) const override { return torch::Device(torch::kCPU); }
};

class LF_API CUDAAccelerator : public Accelerator {
 public:
  std::string name() const override { return "cuda"; }
  bool is_available() const override;
  int auto_device_count() const override;
  std::vector<int> parse_devices(const DevicesSpec& spec) const override;
  torch::Device device_for(int index) const override;
  void setup_device(const torch::Device& device) const override;
};

using AcceleratorRegistry = Registry<Accelerator>;
/// The process-wide accelerator registry, filled with cpu and cuda on first use
/// (src/builtin_registrations.cpp).
LF_API AcceleratorRegistry& accelerator_registry();

/// Every accelerator name the Connector and lightning-run --accelerator accept: "auto", "cpu",
/// "cuda", "gpu" (= cuda), then any other registered name.
LF_API std::vector<std::string> accelerator_choices();

/// The accelerator `value` means on this machine: "auto" is cuda when a GPU is visible, else cpu;
/// "gpu" is cuda; a registered name is itself. ValueError naming `setting` (e.g. "accelerator",
/// "--accelerator"), the value and accelerator_choices() for an unknown name; RuntimeError when
/// cuda is asked for and none is available. The one resolution the Connector and lightning-run
/// share.
LF_API std::string resolve_accelerator(const std::string& value, const std::string& setting = "accelerator");

}  // namespace lightning::fabric
