#include "lightning/fabric/accelerators/accelerator.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <algorithm>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

std::vector<std::string> accelerator_choices() {
  std::vector<std::string> choices = {"auto", "cpu", "cuda", "gpu"};
  for (const auto& name : accelerator_registry().names()) {
    if (std::find(choices.begin(), choices.end(), name) == choices.end()) choices.push_back(name);
  }
  return choices;
}

std::string resolve_accelerator(const std::string& value, const std::string& setting) {
  const auto choices = accelerator_choices();
  LF_CHECK(value != "mps" && value != "tpu", ValueError, setting, "=\"", value,
           "\" exists in Python Lightning but not in the C++ port. Choose one of: ", join_names(choices), ".");
  LF_CHECK(std::find(choices.begin(), choices.end(), value) != choices.end(), ValueError, setting, "=\"", value,
           "\" is not valid. Choose one of: ", join_names(choices), ".");
  if (value == "cpu") return "cpu";
  const bool cuda_available = accelerator_registry().create("cuda")->is_available();
  if (value == "auto") return cuda_available ? "cuda" : "cpu";
  if (value == "gpu" || value == "cuda") {
    LF_CHECK(cuda_available, RuntimeError, setting, "=\"", value, "\" needs a CUDA GPU, but none is available ",
             "(this LibTorch has no CUDA, or no GPU is visible). Use ", setting, "=\"cpu\" or \"auto\".");
    return "cuda";
  }
  return value;
}

std::vector<int> CPUAccelerator::parse_devices(const DevicesSpec& spec) const {
  const int count = parse_cpu_devices(spec);
  std::vector<int> indices(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) indices[static_cast<size_t>(i)] = i;
  return indices;
}

bool CUDAAccelerator::is_available() const { return torch::cuda::is_available(); }

int CUDAAccelerator::auto_device_count() const { return static_cast<int>(torch::cuda::device_count()); }

std::vector<int> CUDAAccelerator::parse_devices(const DevicesSpec& spec) const {
  return parse_cuda_devices(spec, auto_device_count());
}

torch::Device CUDAAccelerator::device_for(int index) const {
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

void CUDAAccelerator::setup_device(const torch::Device& device) const {
  // Makes `device` the current CUDA device of this process, so that kernels and NCCL use it.
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
}

}  // namespace lightning::fabric
