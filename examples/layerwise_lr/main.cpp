// Layer-wise learning rates: one model, two optimizers (SGD with momentum for the convolutional
// body, Adam for the classifier head) and a StepLR scheduler on the body's optimizer, all set up
// in one call. Prints both learning rates and the test accuracy per epoch.
//   build/bin/layerwise_lr --epochs 2
//   lightning-run model --accelerator cpu --devices 2 build/bin/layerwise_lr --epochs 1
#include <CLI/CLI.hpp>
#include <lightning/fabric.h>
#include <torch/torch.h>

#include <iostream>

#include "fashion_cnn.h"
#include "example_flags.h"

namespace lf = lightning::fabric;

int main(int argc, char** argv) {
  examples::ExampleFlags flags;
  CLI::App app{"Two optimizers and a scheduler over one model with Lightning Fabric"};
  flags.add_to(app);
  CLI11_PARSE(app, argc, argv);
  try {
    lf::Fabric fabric(flags.fabric_options());
    fabric.seed_everything(5);
    auto [train_loader, test_loader] = examples::fashion_mnist_loaders(fabric, flags);
    examples::FashionCnn net;
    std::vector<torch::Tensor> body, head;
    for (const auto& item : net->named_parameters()) (item.key().rfind("fc2.", 0) == 0 ? head : body).push_back(item.value());
    torch::optim::SGD body_sgd(body, torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::Adam head_adam(head, torch::optim::AdamOptions(1e-3));
    torch::optim::StepLR body_schedule(body_sgd, /*step_size=*/1, /*gamma=*/0.5);  // halve per epoch
    auto [model, body_optimizer, head_optimizer, scheduler] = fabric.setup(net, body_sgd, head_adam, body_schedule);
    int64_t step = 0;
    const bool progress = flags.shared.show_progress(fabric);
    for (int epoch = 1; epoch <= flags.epochs; ++epoch) {
      lf::ProgressBar bar("epoch " + std::to_string(epoch), train_loader.size(), progress);
      for (auto& batch : train_loader) {
        body_optimizer.zero_grad();
        head_optimizer.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
        fabric.backward(loss);
        body_optimizer.step();
        head_optimizer.step();
        bar.update(1, loss.item<double>());
        if (++step == flags.max_steps) break;
      }
      bar.close();
      torch::NoGradGuard no_grad;
      auto counts = torch::zeros({2}, torch::kFloat64);
      lf::ProgressBar test_bar("test", test_loader.size(), progress);
      for (auto& batch : test_loader) {
        test_bar.update();
        counts[0] += model(batch.data).argmax(1).eq(batch.target).sum().item<double>();
        counts[1] += static_cast<double>(batch.target.size(0));
      }
      test_bar.close();
      counts = fabric.all_reduce(counts, "sum");
      fabric.print("epoch", epoch, "steps", step, "body_lr", body_optimizer.param_groups()[0].options().get_lr(),
                   "head_lr", head_optimizer.param_groups()[0].options().get_lr(), "test_accuracy",
                   (counts[0] / counts[1]).item<double>());
      scheduler.step();
      if (step == flags.max_steps) break;
    }
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "layerwise_lr: " << error.what() << std::endl;
    return 1;
  }
}
