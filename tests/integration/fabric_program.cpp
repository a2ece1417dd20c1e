// A training program for the launch tests: the same binary runs alone (Fabric starts the
// processes when --devices > 1) or under lightning-run. Each rank trains a small model with DDP
// for a few steps and prints one line: rank, world size, and a checksum of its weights.
// --register-strategy registers "counting_ddp" (a ddp under its own name) before Fabric is built,
// as a program with its own strategy does.
//   fabric_program [--devices N] [--fail-rank R] [--launch] [--register-strategy]
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "lightning/fabric.h"

namespace lf = lightning::fabric;

int main(int argc, char** argv) {
  std::string devices = "auto";
  int fail_rank = -1;
  bool call_launch = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--devices") == 0 && i + 1 < argc) devices = argv[++i];
    if (std::strcmp(argv[i], "--fail-rank") == 0 && i + 1 < argc) fail_rank = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--launch") == 0) call_launch = true;
    if (std::strcmp(argv[i], "--register-strategy") == 0) {
      lf::DDPOptions counting;
      counting.name = "counting_ddp";
      lf::strategy_registry().add("counting_ddp", lf::ddp_strategy(counting).create, "a ddp of this program's own");
    }
  }
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").devices(devices));
  if (call_launch) fabric.launch();
  lf::Fabric::seed_everything(1);
  torch::nn::Linear net(8, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  if (fabric.global_rank() == fail_rank) {
    std::cerr << "rank " << fail_rank << " fails on purpose" << std::endl;
    return 3;
  }
  torch::manual_seed(100 + fabric.global_rank());  // different data on each rank
  for (int step = 0; step < 5; ++step) {
    optimizer.zero_grad();
    fabric.backward(model(torch::randn({4, 8})).pow(2).mean());
    optimizer.step();
  }
  const double checksum = net->weight.sum().item<double>() + net->bias.sum().item<double>();
  std::cout.precision(17);
  std::cout << "rank=" << fabric.global_rank() << " world=" << fabric.world_size() << " strategy="
            << fabric.strategy()->name() << " checksum=" << checksum << std::endl;
  fabric.barrier();
  return 0;
}
