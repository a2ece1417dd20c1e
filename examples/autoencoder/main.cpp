// Autoencoder on Fashion-MNIST: an encoder and a decoder under one parent module, one optimizer,
// a reconstruction loss (pixels in [0, 1]). Prints the mean reconstruction error of the test set per epoch.
//   build/bin/autoencoder --epochs 1
//   lightning-run model --accelerator cpu --devices 2 build/bin/autoencoder --epochs 1
#include <CLI/CLI.hpp>
#include <lightning/fabric.h>
#include <torch/torch.h>

#include <iostream>

#include "example_flags.h"

namespace lf = lightning::fabric;

struct AutoencoderImpl : torch::nn::Module {
  AutoencoderImpl()
      : encoder(register_module("encoder", torch::nn::Sequential(torch::nn::Linear(784, 128), torch::nn::ReLU(),
                                                                 torch::nn::Linear(128, 16)))),
        decoder(register_module("decoder", torch::nn::Sequential(torch::nn::Linear(16, 128), torch::nn::ReLU(),
                                                                 torch::nn::Linear(128, 784), torch::nn::Sigmoid()))) {}
  torch::Tensor forward(const torch::Tensor& images) { return decoder->forward(encoder->forward(images.flatten(1))); }
  torch::nn::Sequential encoder, decoder;
};
TORCH_MODULE(Autoencoder);

int main(int argc, char** argv) {
  examples::ExampleFlags flags;
  CLI::App app{"An autoencoder on Fashion-MNIST with Lightning Fabric: two submodules, one optimizer"};
  flags.add_to(app);
  CLI11_PARSE(app, argc, argv);
  try {
    lf::Fabric fabric(flags.fabric_options());
    fabric.seed_everything(3);
    auto [train_loader, test_loader] = examples::fashion_mnist_loaders(fabric, flags);
    Autoencoder net;
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
    auto [model, optimizer] = fabric.setup(net, adam);  // encoder and decoder travel together
    int64_t step = 0;
    const bool progress = flags.shared.show_progress(fabric);
    for (int epoch = 1; epoch <= flags.epochs; ++epoch) {
      lf::ProgressBar bar("epoch " + std::to_string(epoch), train_loader.size(), progress);
      for (auto& batch : train_loader) {
        optimizer.zero_grad();
        auto loss = torch::mse_loss(model(batch.data), examples::to_unit_range(batch.data).flatten(1));
        fabric.backward(loss);
        optimizer.step();
        bar.update(1, loss.item<double>());
        if (++step == flags.max_steps) break;
      }
      bar.close();
      torch::NoGradGuard no_grad;
      auto totals = torch::zeros({2}, torch::kFloat64);  // squared error sum, pixels
      lf::ProgressBar test_bar("test", test_loader.size(), progress);
      for (auto& batch : test_loader) {
        test_bar.update();
        totals[0] += (model(batch.data) - examples::to_unit_range(batch.data).flatten(1)).pow(2).sum().item<double>();
        totals[1] += static_cast<double>(batch.data.numel());
      }
      test_bar.close();
      totals = fabric.all_reduce(totals, "sum");
      fabric.print("epoch", epoch, "steps", step, "test_reconstruction_mse", (totals[0] / totals[1]).item<double>());
      if (step == flags.max_steps) break;
    }
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "autoencoder: " << error.what() << std::endl;
    return 1;
  }
}
