// A DDP program that plants one kind of hang on rank 1, for the hang-detection tests
// (tests/integration/hang_detection.sh). Every rank sets up a model and runs a few all_reduces;
// then, by mode:
//   ok                    every rank finishes
//   skip_all_reduce       rank 1 skips one all_reduce and goes on to the barrier
//   infinite_loop         rank 1 spins in spin_forever_on_purpose() while rank 0 all_reduces
//   stuck_before_barrier  rank 1 sleeps before the barrier rank 0 waits in
//   mismatched_shapes     rank 1 all_reduces 8 elements where rank 0 passes 4
//   unset_model           a loss from a model that was never set up goes to fabric.backward
//   rank_zero_first_throws rank 0 throws inside rank_zero_first; the error must propagate
//   recv_never_sent       rank 1 waits in recv from rank 0, which never sends and goes to the barrier
//   train_until_told GO HOLD  every rank trains until the file GO exists; while the file HOLD exists,
//                         rank 1 waits in hold_on_purpose() between steps (so rank 0 waits in an
//                         all_reduce): the status-view tests (status_view.sh) look at it there
//   hang_program MODE [FILES...]
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>

#include "lightning/fabric.h"

namespace lf = lightning::fabric;

// Named in the stack dump although the target exports no symbols and the project compiles with
// hidden visibility: dumps read each file's full symbol table.
__attribute__((noinline)) void spin_forever_on_purpose() {
  volatile uint64_t counter = 0;
  while (true) counter = counter + 1;
}

__attribute__((noinline)) void sleep_forever_on_purpose() {
  while (true) std::this_thread::sleep_for(std::chrono::hours(1));
}

__attribute__((noinline)) void hold_on_purpose(const std::string& hold) {
  while (std::filesystem::exists(hold)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy("ddp"));
  torch::nn::Linear net(4, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  const int rank = fabric.global_rank();
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    fabric.backward(model(torch::ones({2, 4})).sum());
    optimizer.step();
    fabric.all_reduce(torch::ones({4}), "sum");
  }
  std::cout << "rank " << rank << " trained" << std::endl;
  if (mode == "skip_all_reduce") {
    if (rank != 1) fabric.all_reduce(torch::ones({4}), "sum");
    fabric.barrier();
  } else if (mode == "infinite_loop") {
    if (rank == 1) spin_forever_on_purpose();
    fabric.all_reduce(torch::ones({4}), "sum");
  } else if (mode == "stuck_before_barrier") {
    if (rank == 1) sleep_forever_on_purpose();
    fabric.barrier();
  } else if (mode == "recv_never_sent") {
    if (rank == 1) fabric.recv(torch::empty({4}), 0);
    fabric.barrier();
  } else if (mode == "mismatched_shapes") {
    fabric.all_reduce(torch::ones({rank == 1 ? 8 : 4}), "sum");
  } else if (mode == "unset_model") {
    torch::nn::Linear other(4, 1);
    fabric.backward(other(torch::ones({2, 4})).sum());
  } else if (mode == "rank_zero_first_throws") {
    try {
      auto first = fabric.rank_zero_first();
      if (rank == 0) throw std::runtime_error("preparing the data failed on rank 0");
    } catch (const std::runtime_error& error) {
      std::cout << "rank " << rank << " caught: " << error.what() << std::endl;
      return 5;
    }
  } else if (mode == "train_until_told" && argc > 3) {
    const std::string go = argv[2], hold = argv[3];
    int64_t steps = 3;
    while (true) {
      optimizer.zero_grad();
      fabric.backward(model(torch::ones({2, 4})).sum());
      optimizer.step();
      ++steps;
      if (rank == 1) hold_on_purpose(hold);
      // Rank 0 decides for every rank, so that all stop after the same step.
      const auto told = fabric.all_reduce(torch::tensor({rank == 0 && std::filesystem::exists(go) ? 1.0f : 0.0f}), "sum");
      if (told.item<float>() > 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::cout << "rank " << rank << " stopped when told after " << steps << " steps" << std::endl;
  } else if (mode != "ok") {
    std::cerr << "unknown mode " << mode << std::endl;
    return 2;
  }
  fabric.barrier();
  std::cout << "rank " << rank << " done" << std::endl;
  return 0;
}
