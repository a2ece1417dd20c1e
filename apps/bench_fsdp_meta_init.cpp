// A model larger than one rank may hold, set up and trained under FULL_SHARD: built on the meta
// device (--meta: fabric.init_module(true)) or normally. The model is a Sequential of LAYERS
// Linear(WIDTH, WIDTH) + ReLU, one sharding unit per layer, trained with SGD (no optimizer state;
// --adam: Adam, two states; --no-prefetch: backward_prefetch off)
// on a small batch. Each rank reports its memory from the kernel: the resident set before the
// model is built, after one step of a small model ("base"), the peak resident set (VmHWM) during the build and setup, and the peak
// during the training steps, both above base; large allocations are forced to mmap so freed
// memory leaves the resident set. base_data_mb is the largest VmData at base (what a data limit,
// prlimit --data, counts). The ZeRO-3 formula for this run is parameters + gradients over
// the ranks, 8 * psi / world bytes (16 * psi / world with Adam's two states). --tensor-parallel T:
// the layers alternate column- and row-parallel (tensor_parallel/layers.h) under model_parallel
// with fsdp on the data dimension, mesh (world / T, T): meta initialisation then splits before it
// materialises; with --data-parallel ddp, ddp on the data dimension (each rank allocates its
// tensor-parallel slices whole). Run under lightning-run, with a memory limit if wanted:
//   lightning-run model --accelerator cpu --devices 4 build/bin/bench_fsdp_meta_init --meta [--layers 48] [--width 1024]
#include <lightning/fabric.h>
#include <malloc.h>
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <string>

#include "fsdp_bench_common.h"

namespace lf = lightning::fabric;
using fsdp_bench::status_bytes;


int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);  // fixed: glibc's adaptive threshold would keep freed blocks
  bool meta = false, adam = false, prefetch = true;
  int64_t layers = 48, width = 1024, steps = 3;
  int tensor_parallel = 0;
  std::string data_parallel = "fsdp";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--meta") meta = true;
    if (arg == "--adam") adam = true;
    if (arg == "--no-prefetch") prefetch = false;
    if (arg == "--layers" && i + 1 < argc) layers = std::stoll(argv[++i]);
    if (arg == "--width" && i + 1 < argc) width = std::stoll(argv[++i]);
    if (arg == "--steps" && i + 1 < argc) steps = std::stoll(argv[++i]);
    if (arg == "--tensor-parallel" && i + 1 < argc) tensor_parallel = std::stoi(argv[++i]);
    if (arg == "--data-parallel" && i + 1 < argc) data_parallel = argv[++i];
  }
  lf::FSDPOptions fsdp;
  fsdp.auto_wrap_min_params = 1;  // every Linear is a unit
  fsdp.backward_prefetch = prefetch;
  lf::StrategySpec strategy = lf::fsdp_strategy(fsdp);
  if (tensor_parallel > 0) {
    lf::ModelParallelOptions model_parallel;
    model_parallel.tensor_parallel_size = tensor_parallel;
    model_parallel.data_parallel_strategy = data_parallel;
    model_parallel.fully_sharded = fsdp;
    strategy = lf::model_parallel_strategy(model_parallel);
  }
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy(strategy));
  fabric.seed_everything(0);
  fsdp_bench::warm_up(fabric);  // the code and buffers every step touches are part of base
  const int64_t base = status_bytes("VmRSS"), base_data = status_bytes("VmData");
  fsdp_bench::reset_peak_rss();
  const auto build_start = std::chrono::steady_clock::now();
  torch::nn::Sequential net = nullptr;
  {
    auto guard = fabric.init_module(/*empty_init=*/meta);
    net = tensor_parallel > 0 ? fsdp_bench::tensor_parallel_stack(layers, width) : fsdp_bench::linear_stack(layers, width);
  }
  int64_t psi = 0;
  for (const auto& parameter : net->parameters()) psi += parameter.numel();
  std::unique_ptr<torch::optim::Optimizer> chosen;
  if (adam) {
    chosen = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-3));
  } else {
    chosen = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(1e-3));
  }
  auto setup = fabric.setup(net, *chosen);
  auto& model = std::get<0>(setup);
  auto& optimizer = std::get<1>(setup);
  const int64_t setup_peak = status_bytes("VmHWM") - base;
  const double setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - build_start).count();
  fsdp_bench::reset_peak_rss();
  for (int64_t i = 0; i < steps; ++i) {
    optimizer.zero_grad();
    fabric.backward(model(torch::randn({4, width})).pow(2).mean());
    optimizer.step();
  }
  const int64_t train_peak = status_bytes("VmHWM") - base;
  auto most = [&](int64_t bytes) {
    return fabric.all_reduce(torch::tensor(static_cast<double>(bytes), torch::kFloat64), "max").item<double>();
  };
  const double setup_most = most(setup_peak), train_most = most(train_peak), base_data_most = most(base_data);
  if (fabric.is_global_zero()) {
    const double world = fabric.world_size(), full = 4.0 * static_cast<double>(psi), zero = (adam ? 16.0 : 8.0) * psi / world;
    std::cout << "{\"benchmark\":\"fsdp meta init\",\"meta\":" << (meta ? "true" : "false")
              << ",\"tensor_parallel\":" << tensor_parallel << ",\"data_parallel\":\"" << data_parallel << "\""
              << ",\"optimizer\":\"" << (adam ? "adam" : "sgd") << "\",\"backward_prefetch\":" << (prefetch ? "true" : "false") << ",\"ranks\":" << world
              << ",\"layers\":" << layers << ",\"width\":" << width << ",\"full_parameter_mb\":" << full / 1e6
              << ",\"base_mb\":" << static_cast<double>(base) / 1e6
              << ",\"base_data_mb\":" << base_data_most / 1e6 << ",\"setup_peak_mb\":" << setup_most / 1e6
              << ",\"setup_peak_over_full_per_world\":" << setup_most / (full / world) << ",\"build_and_setup_s\":" << setup_s
              << ",\"train_peak_mb\":" << train_most / 1e6 << ",\"zero3_mb\":" << zero / 1e6
              << ",\"train_peak_over_zero3\":" << train_most / zero << "}" << std::endl;
  }
  return 0;
}
