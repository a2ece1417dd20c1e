// P1 benchmark: the per-step overhead of Fabric on one device.
//
// Two identical MLPs (784-1024-1024-10, same seed, same batches) are trained side by side: each
// iteration times one raw LibTorch step and one Fabric step (setup / FabricModule forward /
// fabric.backward / FabricOptimizer step), alternating which goes first so that drift and
// thermal noise hit both equally. After the warm-up, the medians and the median of per-pair
// ratios are printed as one JSON object.
//   build/bin/bench_step_time --steps 300 --warmup 30
// --precision P runs the Fabric side in precision P (e.g. bf16-mixed) against the raw float32
// loop: the ratio is then P's step time over 32-true's. --optimizer sgd (momentum 0.9, default) or
// adam picks both sides' optimizer; --fused 0 makes Fabric step through LibTorch's optimizer as the
// raw loop does (default 1: Fabric's default, ATen's fused kernel). --side raw or --side fabric
// times that loop alone, in a process of its own, as a user comparing two programs would (the
// JSON then carries only that side's median); the default, both, interleaves them.
// --detect-nonfinite 1 turns FabricOptions::detect_nonfinite on for the Fabric side (its cost).
#include <ATen/Version.h>
#include <lightning/fabric.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>

namespace lf = lightning::fabric;

namespace {
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 1024))),
        fc2(register_module("fc2", torch::nn::Linear(1024, 1024))),
        fc3(register_module("fc3", torch::nn::Linear(1024, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Which BLAS the process uses (the biggest CPU speed factor): a BLAS library it loaded, else the
// one LibTorch was built with (the PyPI wheel links MKL statically).
std::string loaded_blas() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    for (const char* name : {"openblas", "libmkl", "blis", "libblas"}) {
      if (line.find(name) != std::string::npos) return line.substr(line.find('/'));
    }
  }
  const std::string config = at::show_config();
  const auto at = config.find("BLAS_INFO=");
  return at == std::string::npos ? "unknown" : "built-in " + config.substr(at + 10, config.find_first_of(", \n", at) - at - 10);
}

bool g_cuda = false;  // synchronise around each timed step (CUDA work is asynchronous)

template <class Fn>
double time_ms(Fn&& fn) {
  if (g_cuda) torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  fn();
  if (g_cuda) torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

int arg_int(int argc, char** argv, const std::string& flag, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (flag == argv[i]) return std::stoi(argv[i + 1]);
  }
  return fallback;
}

std::string arg_string(int argc, char** argv, const std::string& flag, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (flag == argv[i]) return argv[i + 1];
  }
  return fallback;
}
}  // namespace

int main(int argc, char** argv) {
  const int steps = arg_int(argc, argv, "--steps", 300);
  const int warmup = arg_int(argc, argv, "--warmup", 30);
  const int batch_size = arg_int(argc, argv, "--batch-size", 64);
  const std::string precision = arg_string(argc, argv, "--precision", "32-true");
  const torch::Device device(arg_string(argc, argv, "--accelerator", "cpu") == "cuda" ? torch::kCUDA : torch::kCPU);
  g_cuda = device.is_cuda();
  if (g_cuda && !torch::cuda::is_available()) {  // a clean refusal (scripts/device-check.sh --dry-run)
    std::cerr << "SKIPPED: no CUDA GPU (bench_step_time --accelerator cuda)\n";
    return 77;
  }
  const std::string optimizer_name = arg_string(argc, argv, "--optimizer", "sgd");
  const bool fused = arg_int(argc, argv, "--fused", 1) != 0;
  const std::string side = arg_string(argc, argv, "--side", "both");
  const bool detect_nonfinite = arg_int(argc, argv, "--detect-nonfinite", 0) != 0;
  if (side != "both" && side != "raw" && side != "fabric") {
    std::cerr << "--side " << side << ": choose both, raw or fabric" << std::endl;
    return 2;
  }
  auto make_optimizer = [&](torch::nn::Module& net) -> std::unique_ptr<torch::optim::Optimizer> {
    if (optimizer_name == "adam") return std::make_unique<torch::optim::Adam>(net.parameters(), torch::optim::AdamOptions(1e-3));
    if (optimizer_name == "sgd") {
      return std::make_unique<torch::optim::SGD>(net.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    }
    throw std::invalid_argument("--optimizer " + optimizer_name + ": choose sgd or adam");
  };

  torch::manual_seed(0);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  for (int i = 0; i < 16; ++i) {
    data.emplace_back(torch::randn({batch_size, 784}).to(device), torch::randint(10, {batch_size}).to(device));
  }

  torch::manual_seed(1);
  Mlp raw_net;
  raw_net->to(device);
  auto raw_optimizer = make_optimizer(*raw_net);
  auto raw_step = [&](const torch::Tensor& x, const torch::Tensor& y) {
    raw_optimizer->zero_grad();
    auto loss = torch::nn::functional::cross_entropy(raw_net(x), y);
    loss.backward();
    raw_optimizer->step();
  };

  lf::Fabric fabric(lf::FabricOptions()
                        .accelerator(device.is_cuda() ? "cuda" : "cpu")
                        .precision(precision)
                        .fused_optimizer_steps(fused)
                        .detect_nonfinite(detect_nonfinite));
  fabric.seed_everything(1);
  Mlp fabric_net;
  std::shared_ptr<torch::optim::Optimizer> fabric_optimizer = make_optimizer(*fabric_net);
  auto wrapped = fabric.setup(fabric_net, fabric_optimizer);  // (C++17 lambdas cannot capture structured bindings)
  auto& model = std::get<0>(wrapped);
  auto& optimizer = std::get<1>(wrapped);
  auto fabric_step = [&](const torch::Tensor& x, const torch::Tensor& y) {
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model(x), y);
    fabric.backward(loss);
    optimizer.step();
  };

  std::vector<double> raw_ms, fabric_ms, ratios;
  for (int i = 0; i < warmup + steps; ++i) {
    const torch::Tensor& x = data[static_cast<size_t>(i) % data.size()].first;
    const torch::Tensor& y = data[static_cast<size_t>(i) % data.size()].second;
    if (side != "both") {
      const double ms = side == "raw" ? time_ms([&] { raw_step(x, y); }) : time_ms([&] { fabric_step(x, y); });
      if (i >= warmup) (side == "raw" ? raw_ms : fabric_ms).push_back(ms);
      continue;
    }
    double raw = 0, fab = 0;
    if (i % 2 == 0) {
      raw = time_ms([&] { raw_step(x, y); });
      fab = time_ms([&] { fabric_step(x, y); });
    } else {
      fab = time_ms([&] { fabric_step(x, y); });
      raw = time_ms([&] { raw_step(x, y); });
    }
    if (i < warmup) continue;
    raw_ms.push_back(raw);
    fabric_ms.push_back(fab);
    ratios.push_back(fab / raw);
  }
  if (side != "both") {
    const auto& ms = side == "raw" ? raw_ms : fabric_ms;
    std::cout << "{\"benchmark\":\"P1 step time, one side\",\"side\":\"" << side << "\",\"steps\":" << steps << ",\"optimizer\":\""
              << optimizer_name << "\",\"fabric_fused\":" << (optimizer.fused() ? "true" : "false") << ",\"batch_size\":" << batch_size
              << ",\"threads\":" << torch::get_num_threads() << ",\"median_ms\":" << median(ms) << "}" << std::endl;
    return 0;
  }
  const bool identical = torch::equal(raw_net->fc1->weight, fabric_net->fc1->weight);
  const double difference = (raw_net->fc1->weight - fabric_net->fc1->weight).abs().max().item<double>();
  std::cout << "{\"benchmark\":\"P1 step time\",\"steps\":" << steps << ",\"warmup\":" << warmup << ",\"precision\":\"" << precision << "\""
            << ",\"optimizer\":\"" << optimizer_name << "\",\"fabric_fused\":" << (optimizer.fused() ? "true" : "false")
            << ",\"batch_size\":" << batch_size << ",\"threads\":" << torch::get_num_threads()
            << ",\"raw_median_ms\":" << median(raw_ms) << ",\"fabric_median_ms\":" << median(fabric_ms)
            << ",\"ratio_of_medians\":" << median(fabric_ms) / median(raw_ms)
            << ",\"median_pair_ratio\":" << median(ratios) << ",\"weights_identical\":" << (identical ? "true" : "false") << ",\"max_weight_difference\":" << difference
            << ",\"blas\":\"" << loaded_blas() << "\"}" << std::endl;
  return 0;
}
