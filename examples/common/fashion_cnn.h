// The small CNN the Fashion-MNIST examples train: two convolutions, two linear layers.
#pragma once

#include <torch/torch.h>

namespace examples {

struct FashionCnnImpl : torch::nn::Module {
  /// dropout: the probability of zeroing fc1's outputs while training (0: no dropout layer runs).
  explicit FashionCnnImpl(double dropout = 0.0)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)))),
        fc1(register_module("fc1", torch::nn::Linear(64 * 5 * 5, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))),
        dropout(dropout) {}

  torch::Tensor forward(const torch::Tensor& images) {
    auto x = torch::max_pool2d(torch::relu(conv1(images)), 2);  // 32 x 13 x 13
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);            // 64 x 5 x 5
    x = torch::relu(fc1(x.flatten(1)));
    if (dropout > 0) x = torch::dropout(x, dropout, is_training());
    return fc2(x);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
  double dropout;
};
TORCH_MODULE(FashionCnn);

}  // namespace examples
