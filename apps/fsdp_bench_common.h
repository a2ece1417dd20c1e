// Shared by the memory benchmarks (bench_fsdp_peak, bench_fsdp_meta_init, bench_composed_memory): the kernel's view of
// this process's memory, and their model, a stack of Linear(width, width) + ReLU.
#pragma once

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <torch/optim/sgd.h>

#include "lightning/fabric/fabric.h"
#include "lightning/fabric/tensor_parallel/layers.h"

#include <fstream>
#include <string>

namespace fsdp_bench {

/// A field of /proc/self/status in bytes (VmRSS, VmHWM, VmData, ...); -1 when absent.
inline int64_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

/// Resets the peak resident set: VmHWM := VmRSS.
inline void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

/// One step of a small model under fabric's strategy, so that what every step touches (the
/// process groups, code, buffers) is resident before a benchmark reads its base memory.
inline void warm_up(lightning::fabric::Fabric& fabric) {
  torch::nn::Sequential small(torch::nn::Linear(64, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64));
  torch::optim::SGD sgd(small->parameters(), torch::optim::SGDOptions(1e-3));
  auto [model, optimizer] = fabric.setup(small, sgd);
  fabric.backward(model(torch::randn({4, 64})).pow(2).mean());
  optimizer.step();
}

/// layers x (Linear(width, width), ReLU), built where called (under a guard, if any).
inline torch::nn::Sequential linear_stack(int64_t layers, int64_t width) {
  torch::nn::Sequential net;
  for (int64_t l = 0; l < layers; ++l) {
    net->push_back(torch::nn::Linear(width, width));
    net->push_back(torch::nn::ReLU());
  }
  return net;
}

/// linear_stack's shape with tensor-parallel layers: column- then row-parallel pairs (an odd
/// last layer is column-parallel with its output gathered), each followed by a ReLU.
inline torch::nn::Sequential tensor_parallel_stack(int64_t layers, int64_t width) {
  namespace tp = lightning::fabric::tensor_parallel;
  torch::nn::Sequential net;
  for (int64_t l = 0; l < layers; ++l) {
    tp::ParallelLinearOptions options(width, width);
    if (l % 2 == 1) {
      net->push_back(tp::RowParallelLinear(options));
    } else {
      options.gather_output = l + 1 == layers;
      net->push_back(tp::ColumnParallelLinear(options));
    }
    net->push_back(torch::nn::ReLU());
  }
  return net;
}

}  // namespace fsdp_bench
