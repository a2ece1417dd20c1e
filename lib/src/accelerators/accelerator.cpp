#include "lightning/fabric/accelerators/accelerator.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <torch/cuda.h>

#include <algorithm>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace {
// The CUDA devices this process may use. torch::cuda answers through libtorch_cuda; a process that
// has not loaded it (lightning-run-launcher links LibTorch's CPU parts only) gets 0 from torch, and
// the driver (libcuda.so.1's cuDeviceGetCount, which honours CUDA_VISIBLE_DEVICES) answers instead.
// Where libtorch_cuda is loaded, or LibTorch has no CUDA, or there is no driver: torch's answer.
int visible_cuda_devices() {
  const auto from_torch = static_cast<int>(torch::cuda::device_count());
#ifdef LF_TORCH_HAS_CUDA
  if (from_torch > 0 || dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD) != nullptr) return from_torch;
  static const int from_driver = [] {
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);  // kept loaded: CUDA may use it later
    if (driver == nullptr) return 0;
    using Init = int (*)(unsigned int);
    using Count = int (*)(int*);
    const auto init = reinterpret_cast<Init>(dlsym(driver, "cuInit"));
    const auto count = reinterpret_cast<Count>(dlsym(driver, "cuDeviceGetCount"));
    int devices = 0;
    if (init == nullptr || count == nullptr || init(0) != 0 || count(&devices) != 0) return 0;
    return devices;
  }();
  return from_driver;
#else
  return from_torch;
#endif
}
}  // namespace

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

bool CUDAAccelerator::is_available() const { return visible_cuda_devices() > 0; }

int CUDAAccelerator::auto_device_count() const { return visible_cuda_devices(); }

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
