// Trains a linear model for a few steps through the installed library and checks the loss fell.
#include <lightning/fabric.h>
#include <torch/torch.h>

#include <iostream>

int main() {
  namespace lf = lightning::fabric;
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"));
  fabric.seed_everything(7);
  torch::nn::Linear net(4, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  auto x = torch::randn({64, 4});
  auto y = x.sum(1, true);
  double first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model(x), y);
    fabric.backward(loss);
    optimizer.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  std::cout << "consumer: lightning-fabric " << lf::kVersion << " loss " << first << " -> " << last << std::endl;
  return last < first * 0.1 ? 0 : 1;
}
