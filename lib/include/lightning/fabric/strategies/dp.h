// "dp": one process drives several CUDA devices (Python's DataParallelStrategy). Each forward
// scatters the batch along dimension 0 over the devices, runs a replica of the module on each and
// gathers the outputs on the first device; backward sums the replicas' gradients into the
// original parameters. Built on LibTorch's torch::nn::parallel::data_parallel, which needs a module
// deriving from torch::nn::Cloneable (every TORCH_MODULE built from torch::nn layers does) with
// forward(Tensor) -> Tensor. On CPU the Connector replaces "dp" by "ddp" with a warning, as
// Lightning does. One process: it derives from Strategy, forms no process group, and its
// collectives are the base's identities (Python places it under ParallelStrategy, but none of
// that class's process-group machinery applies to one process).
#pragma once

#include "lightning/fabric/export.h"
#include "lightning/fabric/strategies/strategy.h"

namespace lightning::fabric {

class LF_API DataParallelStrategy : public Strategy {
 public:
  /// Throws ValueError unless every parallel device is a CUDA device.
  explicit DataParallelStrategy(StrategyContext context);
  std::string name() const override { return "dp"; }
  torch::Device root_device() const override { return context_.parallel_devices.front(); }
  // One process, whatever the environment says about devices.
  int world_size() const override { return 1; }
  int global_rank() const override { return 0; }
  int local_rank() const override { return 0; }
  int node_rank() const override { return 0; }
  const std::vector<torch::Device>& data_parallel_devices() const override { return context_.parallel_devices; }
};

}  // namespace lightning::fabric
