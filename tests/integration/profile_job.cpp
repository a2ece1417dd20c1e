// A short ddp training job for the profiler switch (profile_traces.sh): 5 optimizer steps of a small
// MLP on every rank, under lightning-run --profile.
#include <lightning/fabric.h>
#include <torch/torch.h>

#include <iostream>

namespace lf = lightning::fabric;

struct MlpImpl : torch::nn::Module {
  MlpImpl() : fc1(register_module("fc1", torch::nn::Linear(16, 32))), fc2(register_module("fc2", torch::nn::Linear(32, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

int main() {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy("ddp"));
  fabric.seed_everything(1);
  Mlp net;
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, optimizer] = fabric.setup(net, adamw);
  for (int step = 0; step < 5; ++step) {
    optimizer.zero_grad();
    auto loss = model(torch::randn({8, 16})).pow(2).mean();
    fabric.backward(loss);
    optimizer.step();
  }
  fabric.barrier();
  if (fabric.is_global_zero()) std::cout << "profile job done" << std::endl;
  return 0;
}
