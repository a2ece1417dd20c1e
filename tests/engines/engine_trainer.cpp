// The training program of the engines tests, run under srun, sbatch, salloc, mpirun, torchrun and
// lightning-run. It leaves devices and num_nodes unset, as a user would, so the launcher decides.
// Every rank trains the same float64 model on its shard of one fixed global batch, so that with
// averaged gradients the weights equal a 1-process run on the whole batch.
//   lf_engine_trainer --out DIR [--global-batch 16] [--steps 5] [--devices N] [--fail-rank R]
//       writes DIR/weights-rank<R>.txt (one %.17g value a line) and prints one line per rank.
//   lf_engine_trainer --compare A B [--tolerance 1e-6]
//       exits 0 when the two weight files agree within the tolerance, else 1, printing the
//       largest difference.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric.h"

namespace lf = lightning::fabric;

namespace {

struct Arguments {
  std::string out;
  int global_batch = 16;
  int steps = 5;
  std::optional<std::string> devices;
  int fail_rank = -1;
  std::vector<std::string> compare;
  double tolerance = 1e-6;
};

Arguments parse(int argc, char** argv) {
  Arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "lf_engine_trainer: " << flag << " needs a value" << std::endl;
        std::exit(2);
      }
      return argv[++i];
    };
    if (flag == "--out") args.out = value();
    else if (flag == "--global-batch") args.global_batch = std::stoi(value());
    else if (flag == "--steps") args.steps = std::stoi(value());
    else if (flag == "--devices") args.devices = value();
    else if (flag == "--fail-rank") args.fail_rank = std::stoi(value());
    else if (flag == "--tolerance") args.tolerance = std::stod(value());
    else if (flag == "--compare") { args.compare.push_back(value()); args.compare.push_back(value()); }
    else {
      std::cerr << "lf_engine_trainer: unknown flag " << flag << std::endl;
      std::exit(2);
    }
  }
  return args;
}

std::vector<double> read_weights(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << "lf_engine_trainer: cannot read " << path << std::endl;
    std::exit(2);
  }
  std::vector<double> values;
  for (double value; in >> value;) values.push_back(value);
  return values;
}

int compare(const Arguments& args) {
  const auto a = read_weights(args.compare[0]), b = read_weights(args.compare[1]);
  if (a.size() != b.size() || a.empty()) {
    std::cerr << "compare: " << a.size() << " vs " << b.size() << " values" << std::endl;
    return 1;
  }
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  std::cout << "compare: max |difference| " << worst << " over " << a.size() << " values (tolerance "
            << args.tolerance << ")" << std::endl;
  return worst <= args.tolerance ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Arguments args = parse(argc, argv);
  if (!args.compare.empty()) return compare(args);
  lf::FabricOptions options;
  options.accelerator("cpu");
  if (args.devices) options.devices(lf::DevicesSpec(*args.devices));
  lf::Fabric fabric(options);
  if (fabric.global_rank() == args.fail_rank) {
    std::cerr << "rank " << args.fail_rank << " fails on purpose before joining" << std::endl;
    return 3;
  }
  // No launch() call: setup() forms the group (and starts the processes when Fabric must), which
  // also works under lightning-run, where an explicit launch() is refused as in Python.
  lf::Fabric::seed_everything(7);
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 1));
  net->to(torch::kFloat64);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);

  const int world = fabric.world_size(), rank = fabric.global_rank();
  if (args.global_batch % world != 0) {
    std::cerr << "global batch " << args.global_batch << " does not split over " << world << " ranks" << std::endl;
    return 2;
  }
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1234);
  const auto inputs = torch::randn({args.global_batch, 8}, generator, torch::kFloat64);
  const auto targets = inputs.sum(1, true).sin();
  const int shard = args.global_batch / world;
  const auto x = inputs.narrow(0, rank * shard, shard), y = targets.narrow(0, rank * shard, shard);
  for (int step = 0; step < args.steps; ++step) {
    optimizer.zero_grad();
    fabric.backward(torch::mse_loss(model(x), y));
    optimizer.step();
  }

  const auto flat = torch::cat([&] {
    std::vector<at::Tensor> parts;
    for (const auto& parameter : net->parameters()) parts.push_back(parameter.detach().flatten());
    return parts;
  }());
  if (!args.out.empty()) {
    std::ofstream out(args.out + "/weights-rank" + std::to_string(rank) + ".txt");
    char line[64];
    for (int64_t i = 0; i < flat.numel(); ++i) {
      std::snprintf(line, sizeof(line), "%.17g\n", flat[i].item<double>());
      out << line;
    }
  }
  std::cout << "rank=" << rank << " world=" << world << " local_rank=" << fabric.local_rank()
            << " node_rank=" << fabric.node_rank() << " strategy=" << fabric.strategy()->name()
            << " environment=" << fabric.strategy()->cluster_environment()->name() << std::endl;
  fabric.barrier();
  return 0;
}
