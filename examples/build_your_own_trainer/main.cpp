// Build your own trainer: trainer.h is a reusable Trainer made of Fabric's primitives; this
// program uses it to train the Fashion-MNIST CNN, with CSV (and TensorBoard) logs and checkpoints.
//   build/bin/build_your_own_trainer --max-epochs 2 --checkpoint-dir ck --log-dir logs
//   lightning-run model --accelerator cpu --devices 2 build/bin/build_your_own_trainer --max-epochs 1
// Run it again with the same --checkpoint-dir and it resumes from the newest checkpoint.
#include <CLI/CLI.hpp>

#include <iostream>

#include "shared_flags.h"
#include "fashion_cnn.h"
#include "fashion_mnist.h"
#include "trainer.h"

namespace lf = lightning::fabric;

int main(int argc, char** argv) {
  trainer::TrainerOptions options;
  examples::SharedFlags shared;  // Fabric options unset unless given; --no-progress
  std::string log_dir;
  std::string data_dir = examples::kDefaultFashionMnistDir;
  int64_t batch_size = 64;
  double lr = 1e-3;
  uint64_t seed = 42;
  CLI::App app{"Train the Fashion-MNIST CNN with a Trainer built from Lightning Fabric's primitives"};
  app.add_option("--max-epochs", options.max_epochs, "Epochs to train")->check(CLI::PositiveNumber);
  app.add_option("--max-steps", options.max_steps, "Optimizer steps in total (-1: no limit)");
  app.add_option("--grad-accum-steps", options.grad_accum_steps, "Micro-batches per optimizer step")->check(CLI::PositiveNumber);
  app.add_option("--limit-train-batches", options.limit_train_batches, "Training batches per epoch (-1: all)");
  app.add_option("--limit-val-batches", options.limit_val_batches, "Validation batches (-1: all)");
  app.add_option("--validation-frequency", options.validation_frequency, "Validate every N epochs")->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-dir", options.checkpoint_dir, "Checkpoints go here (\"\" disables them)");
  app.add_option("--checkpoint-frequency", options.checkpoint_frequency, "Save every N epochs")->check(CLI::PositiveNumber);
  app.add_option("--log-dir", log_dir, "Write CSV and TensorBoard logs under this folder");
  app.add_option("--batch-size", batch_size, "Samples per step and process")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "Adam learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "Global seed");
  app.add_option("--data-dir", data_dir, "Folder with the Fashion-MNIST idx files");
  shared.add_to(app);
  CLI11_PARSE(app, argc, argv);
  try {
    options.fabric = shared.apply(options.fabric);
    options.progress = !shared.no_progress;
    if (!log_dir.empty()) {
      options.fabric.logger(std::make_shared<lf::CSVLogger>(log_dir, "csv"));
      options.fabric.logger(std::make_shared<lf::TensorBoardLogger>(log_dir, "tensorboard"));
    }
    trainer::Trainer<examples::FashionCnn> trainer(options);
    trainer.fabric().seed_everything(seed);
    examples::FashionCnn net;
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(lr));
    examples::FashionMnist train(data_dir, examples::FashionMnist::Split::Train);
    examples::FashionMnist test(data_dir, examples::FashionMnist::Split::Test);
    trainer.fit(net, adam, train.map(torch::data::transforms::Stack<>()), test.map(torch::data::transforms::Stack<>()),
                batch_size);
    trainer.fabric().print("done: epoch", trainer.current_epoch(), "step", trainer.global_step());
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "build_your_own_trainer: " << error.what() << std::endl;
    return 1;
  }
}
