#include "lightning/fabric/accelerators/accelerator.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

namespace lightning::fabric {

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
