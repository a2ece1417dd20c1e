// Image classifier: a small CNN trained on Fashion-MNIST with Lightning Fabric.
//
// The loop is the plain LibTorch loop with four changes: a Fabric object, fabric.setup(...) for
// the model and optimizer, fabric.setup_dataloaders(...) for the data, fabric.backward(loss) for
// loss.backward(). The same binary runs on one CPU, or on several processes under lightning-run:
//   build/bin/image_classifier --epochs 1                      (one process)
//   build/bin/image_classifier --epochs 1 --devices 2          (Fabric starts 2 processes itself)
//   lightning-run model --devices 2 build/bin/image_classifier --epochs 1
//   build/bin/image_classifier --precision bf16-mixed          (mixed precision, one flag)
//   build/bin/image_classifier --checkpoint-dir ck --max-steps 100, then --resume ck/epoch=1-step=100.ckpt
// A resumed run continues bit for bit as the run that was never stopped (dropout included): the
// checkpoint holds fabric.resume_state(), every rank's generators and the loaders' positions.
// Rank 0 prints one JSON object per epoch: epoch, train_loss, test_accuracy, seconds, steps.
#include <CLI/CLI.hpp>
#include <lightning/fabric.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <iostream>

#include "checkpoint_files.h"
#include "shared_flags.h"
#include "fashion_cnn.h"
#include "fashion_mnist.h"

namespace lf = lightning::fabric;

using Net = examples::FashionCnn;  // examples/common/fashion_cnn.h

struct Settings {
  int epochs = 1;
  int batch_size = 64;
  double lr = 1e-3;
  int64_t max_steps = -1;  // stop after this many optimizer steps in total (smoke runs)
  double dropout = 0.0;    // on fc1's outputs
  int64_t checkpoint_every = 0;  // also save every N steps (0: at the end of epochs and --max-steps only)
  std::string data_dir = examples::kDefaultFashionMnistDir;
  uint64_t seed = 42;
  examples::SharedFlags shared;  // Fabric options unset unless given (lightning-run or the launcher decides); --no-progress
  std::string checkpoint_dir;  // save at the end of every epoch and at --max-steps
  std::string resume;          // a checkpoint written by --checkpoint-dir, or "last": the newest there
};

// One checkpoint entry per save: DIR/epoch=E-step=S.ckpt (Lightning's naming).
std::string checkpoint_path(const Settings& settings, int epoch, int64_t step) {
  return settings.checkpoint_dir + "/epoch=" + std::to_string(epoch) + "-step=" + std::to_string(step) + ".ckpt";
}

template <class Model, class Loader>
double evaluate(lf::Fabric& fabric, Model& model, Loader& loader, bool progress) {
  torch::NoGradGuard no_grad;
  model.eval();
  auto counts = torch::zeros({2}, torch::kFloat64);  // correct, seen
  lf::ProgressBar bar("test", loader.size(), progress);
  for (auto& batch : loader) {
    bar.update();
    auto predicted = model(batch.data).argmax(1);
    counts[0] += predicted.eq(batch.target).sum().template item<double>();
    counts[1] += static_cast<double>(batch.target.size(0));
  }
  bar.close();
  counts = fabric.all_reduce(counts, "sum");
  model.train();
  return counts[0].item<double>() / counts[1].item<double>();
}

int run(const Settings& settings) {
  // devices, strategy, ... come from the command line: --devices N here, or lightning-run's flags.
  lf::Fabric fabric(settings.shared.apply());
  const bool progress = settings.shared.show_progress(fabric);
  // No fabric.launch() call: the first setup starts the other processes when devices > 1, and
  // under lightning-run (which refuses launch(), as Python's CLI does) it has nothing to start.
  fabric.seed_everything(settings.seed);

  examples::FashionMnist train(settings.data_dir, examples::FashionMnist::Split::Train);
  examples::FashionMnist test(settings.data_dir, examples::FashionMnist::Split::Test);
  auto train_loader = fabric.setup_dataloaders(train.map(torch::data::transforms::Stack<>()),
                                               torch::data::DataLoaderOptions(settings.batch_size),
                                               lf::DataLoaderSettings{/*shuffle=*/true});
  auto test_loader = fabric.setup_dataloaders(test.map(torch::data::transforms::Stack<>()),
                                              torch::data::DataLoaderOptions(1000));

  Net net(settings.dropout);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(settings.lr));
  auto [model, optimizer] = fabric.setup(net, adam);

  // What a checkpoint holds; --resume restores it in place. "resume": every rank's generators and
  // the loaders' positions, so that the next batch is the one after the last trained on.
  int64_t steps = 0, epoch = 1;
  lf::State state{{"model", model}, {"optimizer", optimizer}, {"epoch", epoch}, {"step", steps},
                  {"resume", fabric.resume_state()}};
  // "last": the newest checkpoint of --checkpoint-dir, if any, so that a job the launcher restarts
  // (after a failure, or with other nodes) goes on from where it was.
  const std::string resume = settings.resume == "last" ? newest_checkpoint(settings.checkpoint_dir) : settings.resume;
  if (fabric.restart_count() > 0) fabric.print("restart", fabric.restart_count(), "of the job, world size", fabric.world_size());
  if (!resume.empty()) {
    fabric.load(resume, state);
    epoch = state.at("epoch").to<int64_t>();
    steps = state.at("step").to<int64_t>();
    fabric.print("resumed from", resume, "at epoch", epoch, "step", steps);
  }
  auto save = [&](bool epoch_finished) {
    if (settings.checkpoint_dir.empty()) return;
    state.at("epoch").set_value(epoch_finished ? epoch + 1 : epoch);
    state.at("step").set_value(steps);
    fabric.save(checkpoint_path(settings, static_cast<int>(epoch), steps), state);
  };

  for (; epoch <= settings.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    int64_t batches = 0;
    std::optional<int64_t> total = train_loader.size();  // this epoch's steps, within --max-steps
    if (total) *total -= steps - (epoch - 1) * *total;   // resumed mid-epoch: the loader skips what was done
    if (total && settings.max_steps > 0) *total = std::min(*total, settings.max_steps - steps);
    lf::ProgressBar bar("epoch " + std::to_string(epoch), total, progress);
    for (auto& batch : train_loader) {
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
      fabric.backward(loss);
      optimizer.step();
      const double value = loss.item<double>();
      loss_sum += value;
      bar.update(1, value);
      ++batches;
      if (++steps == settings.max_steps) break;
      if (settings.checkpoint_every > 0 && steps % settings.checkpoint_every == 0) save(/*epoch_finished=*/false);
    }
    bar.close();
    const bool finished = steps != settings.max_steps;
    const double train_loss = fabric.all_reduce(torch::tensor(loss_sum / std::max<int64_t>(batches, 1)), "mean").item<double>();
    const double accuracy = evaluate(fabric, model, test_loader, progress);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    save(finished);
    if (fabric.is_global_zero()) {
      nlohmann::json line = {{"epoch", epoch},
                             {"train_loss", examples::rounded(train_loss, 4)},
                             {"test_accuracy", examples::rounded(accuracy, 4)},
                             {"seconds", examples::rounded(seconds, 1)},
                             {"steps", steps},
                             {"world_size", fabric.world_size()}};
      std::cout << line.dump() << std::endl;
    }
    if (!finished) break;
  }
  return 0;
}

int main(int argc, char** argv) {
  Settings settings;
  CLI::App app{"Train a small CNN on Fashion-MNIST with Lightning Fabric"};
  app.add_option("--epochs", settings.epochs, "Passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", settings.batch_size, "Samples per step and process")->check(CLI::PositiveNumber);
  app.add_option("--lr", settings.lr, "Adam learning rate")->check(CLI::PositiveNumber);
  app.add_option("--max-steps", settings.max_steps, "Stop after this many steps in total (-1: no limit)");
  app.add_option("--data-dir", settings.data_dir, "Folder with the Fashion-MNIST idx files");
  app.add_option("--seed", settings.seed, "Global seed");
  app.add_option("--dropout", settings.dropout, "Dropout probability on the hidden layer")->check(CLI::Range(0.0, 0.99));
  app.add_option("--checkpoint-every", settings.checkpoint_every,
                 "With --checkpoint-dir: also save every N steps")->check(CLI::NonNegativeNumber);
  settings.shared.add_to(app);
  app.add_option("--checkpoint-dir", settings.checkpoint_dir,
                 "Save a checkpoint here at the end of every epoch and at --max-steps (epoch=E-step=S.ckpt)");
  app.add_option("--resume", settings.resume,
                 "Continue from a checkpoint written by --checkpoint-dir; \"last\": from the newest one there, if any")
      ->check(CLI::ExistingPath | CLI::IsMember({"last"}));
  CLI11_PARSE(app, argc, argv);
  try {
    return run(settings);
  } catch (const std::exception& error) {
    std::cerr << "image_classifier: " << error.what() << std::endl;
    return 1;
  }
}
