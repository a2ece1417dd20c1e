// DCGAN on Fashion-MNIST: two models with their own optimizers, two fabric.setup calls, and
// alternating updates (discriminator, then generator) every step. Rank 0 writes an 8 x 8 PNG grid
// of generated samples at the end of every epoch (and at --max-steps). With --tensorboard DIR it
// also logs the losses, the grid, the generator's weight histograms and the hyperparameters there.
//   build/bin/dcgan --epochs 1 --output-dir dcgan-out [--tensorboard logs]
//   lightning-run model --accelerator cpu --devices 2 build/bin/dcgan --epochs 1 [--sync-batchnorm]
#include <CLI/CLI.hpp>
#include <lightning/fabric.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
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

// 64 generated images in [-1, 1] as an 8 x 8 grid in [0, 1], 2-pixel dark gaps: 242 x 242.
torch::Tensor sample_grid(const torch::Tensor& images) {
  const auto unit = (images.detach().cpu().clamp(-1, 1) + 1) / 2;
  return lf::make_image_grid(unit.view({-1, 1, 28, 28}), 8, 2, 32.0 / 255);
}

void write_png(const torch::Tensor& grid, const std::string& path) {
  const auto pixels = grid.mul(255).round().to(torch::kUInt8).squeeze(0).contiguous();
  const std::string png = lf::encode_png(pixels.data_ptr<uint8_t>(), static_cast<int>(pixels.size(1)),
                                         static_cast<int>(pixels.size(0)), 1);
  std::ofstream out(path, std::ios::binary);
  out.write(png.data(), static_cast<std::streamsize>(png.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

int main(int argc, char** argv) {
  examples::ExampleFlags flags;
  std::string output_dir = "dcgan-out";
  bool sync_batchnorm = false;
  std::string tensorboard_dir;
  CLI::App app{"DCGAN on Fashion-MNIST with Lightning Fabric: two models, two optimizers"};
  flags.add_to(app);
  app.add_option("--output-dir", output_dir, "Where the PNG grids go");
  app.add_flag("--sync-batchnorm", sync_batchnorm,
               "Normalise over every rank's batch together (lf::SyncBatchNorm) instead of each rank's own");
  app.add_option("--tensorboard", tensorboard_dir, "Also log losses, grids, histograms and hyperparameters for TensorBoard here");
  CLI11_PARSE(app, argc, argv);
  try {
    lf::FabricOptions options = flags.fabric_options();
    std::shared_ptr<lf::TensorBoardLogger> board;
    if (!tensorboard_dir.empty()) options.logger(board = std::make_shared<lf::TensorBoardLogger>(tensorboard_dir, "dcgan"));
    lf::Fabric fabric(options);
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
    if (board && fabric.is_global_zero()) {
      board->log_hyperparams({{"batch_size", flags.batch_size}, {"lr", 2e-4}, {"latent", kLatent},
                              {"sync_batchnorm", sync_batchnorm}, {"world_size", fabric.world_size()}},
                             {});  // hp_metric -1, as Lightning's default: the loss curves get no extra point
    }

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
        const double d_value = d_loss.item<double>(), g_value = g_loss.item<double>();
        d_sum += d_value;
        g_sum += g_value;
        if (board) fabric.log_dict({{"d_loss", d_value}, {"g_loss", g_value}}, step + 1);
        ++batches;
        bar.update(1, g_value);
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
      if (fabric.is_global_zero()) {
        const auto grid = sample_grid(samples);
        write_png(grid, path);
        if (board) {
          board->log_image("samples", grid, step);
          // Under fsdp the module holds no full parameters between steps: no histograms then.
          for (const auto& item : generator_net->named_parameters()) {
            if (item.value().numel() > 0) board->log_histogram("generator/" + item.key(), item.value(), step);
          }
        }
      }
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
