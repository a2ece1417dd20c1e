// P6b: how much memory a FULL_SHARD training step needs above the memory held at rest, with the
// whole model as one sharding unit and with one unit per layer (auto_wrap_min_params). The model
// is a Sequential of LAYERS Linear(WIDTH, WIDTH) + ReLU, trained with Adam on a small batch (so
// activations are negligible). Measured from the kernel: the process's peak resident set
// (VmHWM, reset through /proc/self/clear_refs after two warm-up steps) minus its resident set
// before the measured steps; large allocations are forced to mmap so freed memory leaves the RSS.
// Run under lightning-run:
//   lightning-run model --accelerator cpu --devices 2 build/bin/bench_fsdp_peak [--units] [--layers 8] [--width 1024]
#include <lightning/fabric.h>
#include <malloc.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <string>

#include "fsdp_bench_common.h"

namespace lf = lightning::fabric;
using fsdp_bench::status_bytes;


int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);  // fixed: glibc's adaptive threshold would keep freed blocks
  bool units = false;
  int64_t layers = 8, width = 1024;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--units") units = true;
    if (arg == "--layers" && i + 1 < argc) layers = std::stoll(argv[++i]);
    if (arg == "--width" && i + 1 < argc) width = std::stoll(argv[++i]);
  }
  lf::FSDPOptions fsdp;
  fsdp.auto_wrap_min_params = units ? 1 : 0;
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy(lf::fsdp_strategy(fsdp)));
  fabric.seed_everything(0);
  torch::nn::Sequential net = fsdp_bench::linear_stack(layers, width);
  int64_t psi = 0;
  for (const auto& parameter : net->parameters()) psi += parameter.numel();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  auto setup = fabric.setup(net, adam);
  auto& model = std::get<0>(setup);
  auto& optimizer = std::get<1>(setup);
  auto step = [&] {
    optimizer.zero_grad();
    fabric.backward(model(torch::randn({4, width})).pow(2).mean());
    optimizer.step();
  };
  step();
  step();
  const int64_t rest = status_bytes("VmRSS");
  fsdp_bench::reset_peak_rss();
  for (int i = 0; i < 3; ++i) step();
  const int64_t extra = status_bytes("VmHWM") - rest;
  const auto most = fabric.all_reduce(torch::tensor(static_cast<double>(extra), torch::kFloat64), "max").item<double>();
  if (fabric.is_global_zero()) {
    const int64_t full = psi * 4, unit = (width * width + width) * 4;
    std::cout << "{\"benchmark\":\"P6b step peak\",\"units\":" << (units ? "true" : "false")
              << ",\"ranks\":" << fabric.world_size() << ",\"layers\":" << layers << ",\"full_parameter_bytes\":" << full
              << ",\"one_layer_bytes\":" << unit << ",\"step_peak_above_rest_bytes\":" << static_cast<int64_t>(most)
              << ",\"peak_over_full_parameters\":" << most / static_cast<double>(full) << "}" << std::endl;
  }
  return 0;
}
