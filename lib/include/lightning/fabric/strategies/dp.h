// "dp": one process drives several CUDA devices (Python's DataParallelStrategy). Each forward
// scatters the batch along dimension 0 over the devices, runs a replica of the module on each and
// gathers the outputs on the first device; backward sums the replicas' gradients into the
// original parameters. Built on LibTorch's torch::nn::parallel::data_parallel, which needs a module
// deriving from torch::nn::Cloneable (every TORCH_MODULE built from torch::nn layers does) with
// forward(Tensor) -> Tensor. On CPU the Connector replaces "dp" by "ddp" with a warning, as
// Lightning does. A sibling of ddp and fsdp under ParallelStrategy, as in Python, but with one
// process: it forms no process group and its collectives are identities.
#pragma once

#include "lightning/fabric/export.h"
#include "lightning/fabric/strategies/parallel.h"

namespace lightning::fabric {

class LF_API DataParallelStrategy : public ParallelStrategy {
 public:
  /// Throws ValueError unless every parallel device is a CUDA device.
  explicit DataParallelStrategy(StrategyContext context);
  std::string name() const override { return "dp"; }
  torch::Device root_device() const override { return context_.parallel_devices.front(); }
  int world_size() const override { return 1; }
  int global_rank() const override { return 0; }
  int local_rank() const override { return 0; }
  int node_rank() const override { return 0; }
  const std::vector<torch::Device>& data_parallel_devices() const override { return context_.parallel_devices; }

  // One process: no launcher, no process group, no gradient synchronisation to skip.
  void launch_processes() override {}
  void setup_environment() override { Strategy::setup_environment(); }
  ScopeGuard no_backward_sync(const torch::nn::Module& module, bool enabled) override {
    return Strategy::no_backward_sync(module, enabled);
  }
  void barrier(const std::string& name = {}) override { Strategy::barrier(name); }
  at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op) override { return Strategy::all_reduce(tensor, op); }
  at::Tensor all_gather(const at::Tensor& tensor) override { return Strategy::all_gather(tensor); }
  at::Tensor broadcast(const at::Tensor& tensor, int src) override { return Strategy::broadcast(tensor, src); }
  std::string broadcast_bytes(const std::string& bytes, int src) override { return Strategy::broadcast_bytes(bytes, src); }
};

}  // namespace lightning::fabric
