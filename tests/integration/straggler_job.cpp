// A ddp job with one collective per step, for lightning-run's straggler report (straggler.sh):
//   straggler_job STEPS SLOW_RANK SLEEP_MS [MARK]   (SLOW_RANK -1: a balanced job; MARK is ignored,
//   it lets a test find the job's processes by their command line)
// The slow rank sleeps before every step's all_reduce, so it arrives last by about SLEEP_MS.
#include <lightning/fabric.h>
#include <torch/torch.h>

#include <chrono>
#include <iostream>
#include <string>
#include <thread>

namespace lf = lightning::fabric;

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: straggler_job STEPS SLOW_RANK SLEEP_MS [MARK]" << std::endl;
    return 2;
  }
  const int steps = std::stoi(argv[1]), slow_rank = std::stoi(argv[2]), sleep_ms = std::stoi(argv[3]);
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy("ddp"));
  fabric.barrier();
  for (int step = 0; step < steps; ++step) {
    if (fabric.global_rank() == slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    fabric.all_reduce(torch::ones({4}), "sum");
  }
  fabric.barrier();
  if (fabric.is_global_zero()) std::cout << "straggler job done" << std::endl;
  return 0;
}
