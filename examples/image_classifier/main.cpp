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
//   build/bin/image_classifier --write-data fmnist-jpeg --data-format jpeg   (the training set in
//       LitData's layout, JPEG-encoded; Python's litdata reads it too), then
//   build/bin/image_classifier --data fmnist-jpeg                (streamed: lf::StreamingDataLoader)
// A resumed run continues bit for bit as the run that was never stopped (dropout included): the
// checkpoint holds fabric.resume_state(), every rank's generators and the loaders' positions.
// Rank 0 prints one JSON object per epoch: epoch, train_loss, test_accuracy, seconds, steps, and
// with --data the seconds the loop waited for a batch (data_wait_seconds).
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
  std::string stream_dir;      // --data: train from this streaming dataset (LitData's layout)
  std::string write_dir;       // --write-data: write the training set there, then exit
  std::string data_format = "jpeg";  // --data-format of --write-data: jpeg or tensor
  int loader_threads = 2;      // --loader-threads: background readers of --data
};

// --write-data: the Fashion-MNIST training set as (image, label) items in LitData's layout, the
// image a JPEG of the 28 x 28 grey pixels or their uint8 tensor.
int write_streaming_dataset(const Settings& settings) {
  examples::FashionMnist train(settings.data_dir, examples::FashionMnist::Split::Train);
  const auto pixels = examples::to_unit_range(train.images()).mul(255).round().clamp(0, 255).to(torch::kUInt8);
  lf::StreamingWriter writer(settings.write_dir, lf::StreamingWriterOptions()
                                                     .chunk_bytes(1 << 20)
                                                     .formats({settings.data_format == "jpeg" ? "jpeg" : "tensor", "int"}));
  for (int64_t i = 0; i < pixels.size(0); ++i)
    writer.add(c10::ivalue::Tuple::create({pixels[i][0], train.targets()[i].item<int64_t>()}));
  writer.finish();
  std::cout << "wrote " << writer.size() << " items to " << settings.write_dir << std::endl;
  return 0;
}

// A streamed batch as the model's input: uint8 images [B, H, W] or [B, C, H, W] (a grey JPEG
// decodes to three equal channels) to normalised float [B, 1, H, W]; labels to int64 [B].
std::pair<torch::Tensor, torch::Tensor> model_inputs(const lf::StreamingBatch& batch) {
  const auto& fields = batch.data.toTupleRef().elements();
  torch::Tensor images = fields[0].toTensor();
  if (images.dim() == 4) images = images.narrow(1, 0, 1);
  if (images.dim() == 3) images = images.unsqueeze(1);
  images = (images.to(torch::kFloat32).div(255) - examples::kPixelMean) / examples::kPixelStd;
  return {images, fields[1].toTensor()};
}

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

  // The training data: Fashion-MNIST's idx files through setup_dataloaders, or with --data a
  // streaming dataset read ahead by background threads, each rank its own share (the idx loader
  // then goes unused).
  examples::FashionMnist train(settings.data_dir, examples::FashionMnist::Split::Train);
  examples::FashionMnist test(settings.data_dir, examples::FashionMnist::Split::Test);
  auto train_loader = fabric.setup_dataloaders(train.map(torch::data::transforms::Stack<>()),
                                               torch::data::DataLoaderOptions(settings.batch_size),
                                               lf::DataLoaderSettings{/*shuffle=*/true});
  std::unique_ptr<lf::StreamingDataset> stream_data;
  std::unique_ptr<lf::StreamingDataLoader> stream;
  if (!settings.stream_dir.empty()) {
    stream_data = std::make_unique<lf::StreamingDataset>(settings.stream_dir);
    stream = std::make_unique<lf::StreamingDataLoader>(
        *stream_data, lf::StreamingLoaderOptions()
                          .batch_size(settings.batch_size).shuffle(true).seed(settings.seed)
                          .threads(settings.loader_threads));
    // The data ranks' share, batches on the device (pinned and non-blocking on CUDA), and its
    // position in fabric.resume_state().
    fabric.setup_dataloaders(*stream);
  }
  auto test_loader = fabric.setup_dataloaders(test.map(torch::data::transforms::Stack<>()),
                                              torch::data::DataLoaderOptions(1000));

  Net net(settings.dropout);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(settings.lr));
  auto [set_up_model, set_up_optimizer] = fabric.setup(net, adam);
  auto& model = set_up_model;  // named references: lambdas below use them (C++17 cannot capture bindings)
  auto& optimizer = set_up_optimizer;

  // What a checkpoint holds; --resume restores it in place. "resume": every rank's generators and
  // the loaders' positions (the streaming one's too), so that the next batch is the one after the
  // last trained on.
  int64_t steps = 0, epoch = 1;
  lf::State state{{"model", model}, {"optimizer", optimizer}, {"epoch", epoch}, {"step", steps},
                  {"resume", fabric.resume_state()}};
  // "last": the newest checkpoint of --checkpoint-dir, if any, so that a job the launcher restarts
  // (after a failure, or with other nodes) goes on from where it was.
  const std::string resume = settings.resume == "last" ? newest_checkpoint(settings.checkpoint_dir) : settings.resume;
  if (fabric.restart_count() > 0) fabric.print("restart", fabric.restart_count(), "of the job, world size", fabric.world_size());
  // Under `lightning-run --in-memory-replicas K`, a restarted job goes on from the newest snapshot in
  // the launchers' memory (at most K steps back) rather than from the disk; the disk checkpoint is
  // the fallback when a node and its buddy were lost together.
  if (fabric.restore_snapshot(state, resume)) {
    epoch = state.at("epoch").to<int64_t>();
    steps = state.at("step").to<int64_t>();
    fabric.print("restored the in-memory snapshot at epoch", epoch, "step", steps);
  } else if (!resume.empty()) {
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
    if (stream) total = stream->batches_per_pass();
    if (total) *total -= steps - (epoch - 1) * *total;   // resumed mid-epoch: the loader skips what was done
    if (total && settings.max_steps > 0) *total = std::min(*total, settings.max_steps - steps);
    lf::ProgressBar bar("epoch " + std::to_string(epoch), total, progress);
    // One optimizer step; true when the run stops here (--max-steps).
    auto train_step = [&](const torch::Tensor& data, const torch::Tensor& target) {
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model(data), target);
      fabric.backward(loss);
      optimizer.step();
      const double value = loss.item<double>();
      loss_sum += value;
      bar.update(1, value);
      ++batches;
      ++steps;
      state.at("epoch").set_value(epoch);
      state.at("step").set_value(steps);
      fabric.snapshot(state);  // every K-th call under --in-memory-replicas K; nothing otherwise
      if (steps == settings.max_steps) return true;
      if (settings.checkpoint_every > 0 && steps % settings.checkpoint_every == 0) save(/*epoch_finished=*/false);
      return false;
    };
    if (stream) {
      for (auto& batch : *stream) {
        auto [data, target] = model_inputs(batch);  // already on fabric.device()
        if (train_step(data, target)) break;
      }
    } else {
      for (auto& batch : train_loader) {
        if (train_step(batch.data, batch.target)) break;
      }
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
      if (stream) line["data_wait_seconds"] = examples::rounded(stream->wait_seconds(), 3);
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
  app.add_option("--data", settings.stream_dir,
                 "Train from this streaming dataset (LitData's layout: --write-data's, or litdata.optimize's "
                 "(image, label) items) instead of the idx files")->check(CLI::ExistingDirectory);
  app.add_option("--loader-threads", settings.loader_threads, "With --data: background reading threads")
      ->check(CLI::PositiveNumber);
  app.add_option("--write-data", settings.write_dir,
                 "Write the training set as a streaming dataset into this new folder, then exit");
  app.add_option("--data-format", settings.data_format, "With --write-data: how images are stored")
      ->check(CLI::IsMember({"jpeg", "tensor"}));
  CLI11_PARSE(app, argc, argv);
  try {
    if (!settings.write_dir.empty()) return write_streaming_dataset(settings);
    return run(settings);
  } catch (const std::exception& error) {
    std::cerr << "image_classifier: " << error.what() << std::endl;
    return 1;
  }
}
