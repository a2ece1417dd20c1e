// The command-line flags the small Fashion-MNIST examples share, and their data loaders.
#pragma once

#include <CLI/CLI.hpp>
#include <lightning/fabric.h>

#include <string>
#include <utility>

#include "shared_flags.h"
#include "fashion_mnist.h"

namespace examples {

struct ExampleFlags {
  int epochs = 1;
  int64_t max_steps = -1;  // stop after this many steps in total (smoke runs)
  int64_t batch_size = 64;
  std::string data_dir = kDefaultFashionMnistDir;
  SharedFlags shared;  // --accelerator, --devices, --strategy, --precision (unset unless given), --no-progress

  void add_to(CLI::App& app) {
    app.add_option("--epochs", epochs, "Passes over the training set")->check(CLI::PositiveNumber);
    app.add_option("--max-steps", max_steps, "Stop after this many steps (-1: no limit)");
    app.add_option("--batch-size", batch_size, "Images per step and process")->check(CLI::PositiveNumber);
    app.add_option("--data-dir", data_dir, "Folder with the Fashion-MNIST idx files");
    shared.add_to(app);
  }
  lightning::fabric::FabricOptions fabric_options() const { return shared.apply(); }
};

/// The training loader (shuffled, distributed) and the test loader (batches of 1000).
template <class Fabric>
auto fashion_mnist_loaders(Fabric& fabric, const ExampleFlags& flags) {
  FashionMnist train(flags.data_dir, FashionMnist::Split::Train);
  FashionMnist test(flags.data_dir, FashionMnist::Split::Test);
  auto train_loader = fabric.setup_dataloaders(train.map(torch::data::transforms::Stack<>()),
                                               torch::data::DataLoaderOptions(flags.batch_size),
                                               lightning::fabric::DataLoaderSettings{/*shuffle=*/true});
  auto test_loader = fabric.setup_dataloaders(test.map(torch::data::transforms::Stack<>()),
                                              torch::data::DataLoaderOptions(1000));
  return std::make_pair(std::move(train_loader), std::move(test_loader));
}

}  // namespace examples
