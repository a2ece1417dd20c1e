// DCGAN on Fashion-MNIST: two models with their own optimizers, two fabric.setup calls, and
// alternating updates (discriminator, then generator) every step. Rank 0 writes an 8 x 8 PNG grid
// of generated samples at the end of every epoch (and at --max-steps).
//   build/bin/dcgan --epochs 1 --output-dir dcgan-out
//   lightning-run model --accelerator cpu --devices 2 build/bin/dcgan --epochs 1 [--sync-batchnorm]
#include <CLI/CLI.hpp>
#include <lightning/fabric.h>
#include <torch/torch.h>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

#include <filesystem>
#include <iostream>

#include "example_flags.h"

namespace lf = lightning::fabric;

constexpr int64_t kLatent = 64;

// BatchNorm2d, or with --sync-batchnorm lf::SyncBatchNorm: the statistics of every rank's batch
// together (the same parameter and buffer names either way, so checkpoints load into both).
torch::nn::AnyModule batch_norm(torch::nn::Module& parent, const std::string& name, int64_t channels, bool sync) {
  if (sync) return torch::nn::AnyModule(parent.register_module(name, lf::SyncBatchNorm(channels)));
  return torch::nn::AnyModule(parent.register_module(name, torch::nn::BatchNorm2d(channels)));
}

// z (64) -> 128 x 7 x 7 -> 64 x 14 x 14 -> 1 x 28 x 28 in [-1, 1]
struct GeneratorImpl : torch::nn::Module {
  explicit GeneratorImpl(bool sync_batchnorm)
      : project(register_module("project", torch::nn::Linear(kLatent, 128 * 7 * 7))),
        norm0(batch_norm(*this, "norm0", 128, sync_batchnorm)),
        up1(register_module("up1", torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(128, 64, 4).stride(2).padding(1)))),
        norm1(batch_norm(*this, "norm1", 64, sync_batchnorm)),
        up2(register_module("up2", torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(64, 1, 4).stride(2).padding(1)))) {}
  torch::Tensor forward(const torch::Tensor& z) {
    auto x = torch::relu(norm0.forward(project(z).view({-1, 128, 7, 7})));
    x = torch::relu(norm1.forward(up1(x)));
    return torch::tanh(up2(x));
  }
  torch::nn::Linear project;
  torch::nn::AnyModule norm0;
  torch::nn::ConvTranspose2d up1;
  torch::nn::AnyModule norm1;
  torch::nn::ConvTranspose2d up2;
};
TORCH_MODULE(Generator);

// 1 x 28 x 28 -> 64 x 14 x 14 -> 128 x 7 x 7 -> one logit (real or generated)
struct DiscriminatorImpl : torch::nn::Module {
  explicit DiscriminatorImpl(bool sync_batchnorm)
      : down1(register_module("down1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 64, 4).stride(2).padding(1)))),
        down2(register_module("down2", torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 128, 4).stride(2).padding(1)))),
        norm(batch_norm(*this, "norm", 128, sync_batchnorm)),
        head(register_module("head", torch::nn::Linear(128 * 7 * 7, 1))) {}
  torch::Tensor forward(const torch::Tensor& images) {
    auto x = torch::leaky_relu(down1(images), 0.2);
    x = torch::leaky_relu(norm.forward(down2(x)), 0.2);
    return head(x.flatten(1)).squeeze(1);
  }
  torch::nn::Conv2d down1, down2;
  torch::nn::AnyModule norm;
  torch::nn::Linear head;
};
TORCH_MODULE(Discriminator);

// An 8 x 8 grid of 28 x 28 images in [-1, 1], 2-pixel gaps, as an 8-bit greyscale PNG.
void write_grid(const torch::Tensor& images, const std::string& path) {
  constexpr int kSide = 8, kCell = 28, kGap = 2, kSize = kSide * (kCell + kGap) + kGap;
  auto pixels = ((images.detach().cpu().clamp(-1, 1) + 1) * 127.5).to(torch::kUInt8).view({-1, kCell, kCell});
  std::vector<uint8_t> canvas(kSize * kSize, 32);
  for (int i = 0; i < std::min<int64_t>(kSide * kSide, pixels.size(0)); ++i) {
    const int top = kGap + (i / kSide) * (kCell + kGap), left = kGap + (i % kSide) * (kCell + kGap);
    auto image = pixels[i].contiguous();
    for (int row = 0; row < kCell; ++row) {
      std::memcpy(&canvas[static_cast<size_t>((top + row) * kSize + left)], image[row].data_ptr<uint8_t>(), kCell);
    }
  }
  if (!stbi_write_png(path.c_str(), kSize, kSize, 1, canvas.data(), kSize)) {
    throw std::runtime_error("cannot write " + path);
  }
}

int main(int argc, char** argv) {
  examples::ExampleFlags flags;
  std::string output_dir = "dcgan-out";
  bool sync_batchnorm = false;
  CLI::App app{"DCGAN on Fashion-MNIST with Lightning Fabric: two models, two optimizers"};
  flags.add_to(app);
  app.add_option("--output-dir", output_dir, "Where the PNG grids go");
  app.add_flag("--sync-batchnorm", sync_batchnorm,
               "Normalise over every rank's batch together (lf::SyncBatchNorm) instead of each rank's own");
  CLI11_PARSE(app, argc, argv);
  try {
    lf::Fabric fabric(flags.fabric_options());
    fabric.seed_everything(7);
    examples::FashionMnist train(flags.data_dir, examples::FashionMnist::Split::Train);
    auto loader = fabric.setup_dataloaders(train.map(torch::data::transforms::Stack<>()),
                                           torch::data::DataLoaderOptions(flags.batch_size).drop_last(true),
                                           lf::DataLoaderSettings{/*shuffle=*/true});
    Generator generator_net(sync_batchnorm);
    Discriminator discriminator_net(sync_batchnorm);
    torch::optim::Adam g_adam(generator_net->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
    torch::optim::Adam d_adam(discriminator_net->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
    auto [generator, g_optimizer] = fabric.setup(generator_net, g_adam);          // setup call one
    auto [discriminator, d_optimizer] = fabric.setup(discriminator_net, d_adam);  // setup call two
    const auto fixed_noise = fabric.to_device(torch::randn({64, kLatent}));
    if (fabric.is_global_zero()) std::filesystem::create_directories(output_dir);

    int64_t step = 0;
    for (int epoch = 1; epoch <= flags.epochs; ++epoch) {
      lf::ProgressBar bar("epoch " + std::to_string(epoch), loader.size(), flags.shared.show_progress(fabric));
      double d_sum = 0, g_sum = 0;
      int64_t batches = 0;
      for (auto& batch : loader) {
        const auto real = examples::to_unit_range(batch.data) * 2 - 1;  // pixels in [-1, 1], as tanh outputs
        const auto ones = torch::ones({real.size(0)}, real.options()), zeros = torch::zeros({real.size(0)}, real.options());
        auto fake = generator(torch::randn({real.size(0), kLatent}, real.options()));
        // Discriminator: real -> 1, generated -> 0 (the generator is not updated here).
        d_optimizer.zero_grad();
        auto d_loss = torch::binary_cross_entropy_with_logits(discriminator(real), ones) +
                      torch::binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros);
        fabric.backward(d_loss);
        d_optimizer.step();
        // Generator: make the discriminator answer 1.
        g_optimizer.zero_grad();
        auto g_loss = torch::binary_cross_entropy_with_logits(discriminator(fake), ones);
        fabric.backward(g_loss);
        g_optimizer.step();
        d_sum += d_loss.item<double>();
        g_sum += g_loss.item<double>();
        ++batches;
        bar.update(1, g_loss.item<double>());
        if (++step == flags.max_steps) break;
      }
      bar.close();
      generator.eval();
      torch::Tensor samples;
      {
        torch::NoGradGuard no_grad;
        samples = generator(fixed_noise);
      }
      generator.train();
      const std::string path = output_dir + "/epoch_" + std::to_string(epoch) + ".png";
      if (fabric.is_global_zero()) write_grid(samples, path);
      fabric.print("epoch", epoch, "steps", step, "d_loss", d_sum / std::max<int64_t>(batches, 1), "g_loss",
                   g_sum / std::max<int64_t>(batches, 1), "grid", path);
      if (step == flags.max_steps) break;
    }
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "dcgan: " << error.what() << std::endl;
    return 1;
  }
}
