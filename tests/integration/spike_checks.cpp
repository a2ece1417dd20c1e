// lf::SpikeDetection against Python Lightning Fabric's SpikeDetection:
//   lf_spike_checks cases       one process: for each case of kCases, the batch a spike is found
//                               at ("none" if none) and the running mean, one line per case, which
//                               tests/integration/spike_detection.sh compares with Python's
//   lf_spike_checks ranks DIR   under lightning-run on 2 ranks: rank 1 alone spikes at batch 5;
//                               every rank must throw there, rank 0 writes DIR/skip_batches.json
//                               ([4, 5]); a detector restored from state_dict continues alike
// Each rank prints "FAIL: ..." per failed check and exits 1 if any failed.
#include <torch/torch.h>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <limits>

#include "expect.h"
#include "lightning/fabric.h"

namespace lf = lightning::fabric;

namespace {
using checks::expect;

const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Case {
  lf::SpikeDetectionOptions options;
  std::vector<double> losses;
};

// Kept in step with the CASES list of spike_detection.sh.
std::vector<Case> cases() {
  return {
      {lf::SpikeDetectionOptions(), {1, 1, 1, 5}},
      {lf::SpikeDetectionOptions(), {5, 4, 3, 2, 1}},
      {lf::SpikeDetectionOptions(), {1, kNaN}},
      {[] { lf::SpikeDetectionOptions o; o.finite_only = false; return o; }(), {1, kNaN, 1, 5}},
      {lf::SpikeDetectionOptions().maximize().relative(0.5), {1, 2, 3, 1}},
      {lf::SpikeDetectionOptions().relative(std::nullopt).absolute(0.5), {1, 1, 1.4, 1.8}},
      {lf::SpikeDetectionOptions().over(2), {5, 1, 1, 3.5}},
      {lf::SpikeDetectionOptions(), {5, 1, 1, 3.5}},
      {lf::SpikeDetectionOptions().after(3), {1, 10, 1, 1}},
      {lf::SpikeDetectionOptions().after(2), {1, kNaN, 1, 10}},
  };
}

void run_cases(lf::Fabric& fabric, const std::filesystem::path& folder) {
  int index = 0;
  for (auto& one : cases()) {
    one.options.exclude_to(folder / ("case" + std::to_string(index) + ".json"));
    lf::SpikeDetection detector(one.options);
    std::string found = "none";
    for (size_t batch = 0; batch < one.losses.size(); ++batch) {
      try {
        detector.on_train_batch_end({{"fabric", &fabric}, {"loss", torch::tensor(one.losses[batch])},
                                     {"batch_idx", static_cast<int64_t>(batch)}});
      } catch (const lf::TrainingSpikeException& spike) {
        found = std::to_string(spike.batch_idx());
        break;
      }
    }
    const double mean = detector.running_mean();
    std::cout << "case " << index++ << ": spike " << found << " mean " << std::fixed << std::setprecision(6)
              << (std::isnan(mean) ? 0.0 : mean) << std::endl;
  }
}

// detector: registered as the Fabric's callback, reached through fabric.call as the docs show.
void run_ranks(lf::Fabric& fabric, const std::shared_ptr<lf::SpikeDetection>& detector, const lf::SpikeDetectionOptions& options) {
  const int rank = fabric.global_rank();
  const std::filesystem::path folder = *options.exclude_batches_path;
  lf::SpikeDetection resumed(options);
  int64_t thrown = -1, resumed_thrown = -1;
  for (int64_t batch = 0; batch < 8; ++batch) {
    const double loss = (rank == 1 && batch == 5) ? 50.0 : 2.0 - 0.1 * static_cast<double>(batch);
    if (batch == 3) resumed.load_state_dict(detector->state_dict());  // from here on, the same decisions
    try {
      if (batch >= 3) resumed.on_train_batch_end({{"fabric", &fabric}, {"loss", loss}, {"batch_idx", batch}});
    } catch (const lf::TrainingSpikeException& spike) {
      resumed_thrown = spike.batch_idx();
    }
    try {
      fabric.call("on_train_batch_end", {{"loss", torch::tensor(loss)}, {"batch_idx", batch}});
    } catch (const lf::TrainingSpikeException& spike) {
      thrown = spike.batch_idx();
      expect(std::string(spike.what()) == "Training spike detected in batch 5", std::string("the message: ") + spike.what());
      break;
    }
  }
  expect(thrown == 5, "rank " + std::to_string(rank) + " threw at batch " + std::to_string(thrown) + ", expected 5");
  expect(resumed_thrown == 5, "the detector restored from state_dict threw at batch " + std::to_string(resumed_thrown));
  expect(detector->bad_batches() == std::vector<int64_t>{4, 5}, "bad batches 4 and 5 on every rank");
  fabric.barrier();
  if (fabric.is_global_zero()) {
    std::ifstream in(folder / "skip_batches.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    expect(text == "[\n    4,\n    5\n]", "skip_batches.json as Python's json.dump(indent=4) writes it, got: " + text);
  }
}

// Rollback (fabric.roll_back_on_bad_steps) on 2 ranks: a spike before any checkpoint still throws,
// saying so; after a save at batch 2, rank 1's spike at batch 5 rolls every rank back to the saved
// weights instead of throwing, and training goes on.
void run_rollback(lf::Fabric& fabric, const std::shared_ptr<lf::SpikeDetection>& detector, const std::filesystem::path& folder) {
  const int rank = fabric.global_rank();
  torch::manual_seed(3);
  torch::nn::Linear net(4, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto setup = fabric.setup(net, sgd);  // (C++17 lambdas cannot capture structured bindings)
  auto& model = std::get<0>(setup);
  auto& optimizer = std::get<1>(setup);
  lf::State state{{"model", model}, {"optimizer", optimizer}};
  fabric.roll_back_on_bad_steps(state);
  const auto weights = [&] { return torch::cat({model->weight.detach().flatten(), model->bias.detach()}).clone(); };

  lf::SpikeDetection early(lf::SpikeDetectionOptions().exclude_to(folder / "early"));
  std::string message;
  for (int64_t batch = 0; batch < 3 && message.empty(); ++batch) {
    try {
      early.on_train_batch_end({{"fabric", &fabric}, {"loss", batch == 2 && rank == 1 ? 50.0 : 2.0}, {"batch_idx", batch}});
    } catch (const lf::TrainingSpikeException& spike) {
      message = spike.what();
    }
  }
  expect(message.rfind("Training spike detected in batch 2\n", 0) == 0 && message.find("no checkpoint to roll back to") != std::string::npos,
         "a spike before any checkpoint throws, saying there is none, got: " + message);

  at::Tensor saved;
  for (int64_t batch = 0; batch < 8; ++batch) {
    optimizer.zero_grad();
    fabric.backward(model(torch::full({2, 4}, 1.0 + static_cast<double>(batch))).pow(2).mean());
    optimizer.step();
    if (batch == 2) {
      fabric.save(folder / "rollback.ckpt", state);
      saved = weights();
    }
    const double loss = (rank == 1 && batch == 5) ? 50.0 : 2.0 - 0.1 * static_cast<double>(batch);
    try {
      fabric.call("on_train_batch_end", {{"loss", torch::tensor(loss)}, {"batch_idx", batch}});
    } catch (const lf::TrainingSpikeException& spike) {
      expect(false, std::string("with a checkpoint the spike rolls back instead of throwing: ") + spike.what());
    }
    if (batch == 5) expect(torch::equal(weights(), saved), "after the spike at batch 5 every rank holds the weights saved at batch 2");
  }
  expect(!torch::equal(weights(), saved), "training goes on after the rollback");
  expect(detector->bad_batches() == std::vector<int64_t>{4, 5}, "bad batches 4 and 5 on every rank");
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "cases";
  const std::filesystem::path folder = argc > 2 ? argv[2] : std::filesystem::temp_directory_path();
  const auto options = lf::SpikeDetectionOptions().exclude_to(folder);
  auto detector = std::make_shared<lf::SpikeDetection>(options);
  lf::FabricOptions fabric_options = lf::FabricOptions().accelerator("cpu").strategy(mode == "cases" ? "single_device" : "ddp");
  if (mode != "cases") fabric_options.callback(detector);
  lf::Fabric fabric(fabric_options);
  if (mode == "cases") {
    run_cases(fabric, folder);
  } else if (mode == "rollback") {
    run_rollback(fabric, detector, folder);
  } else {
    run_ranks(fabric, detector, options);
  }
  expect(lf::SpikeDetection(lf::SpikeDetectionOptions()).running_mean() != 0.0, "no mean before any loss");
  bool refused = false;
  try {
    lf::SpikeDetection bad(lf::SpikeDetectionOptions{"median"});
  } catch (const lf::ValueError& error) {
    refused = std::string(error.what()).find("\"median\"") != std::string::npos;
  }
  expect(refused, "an unknown mode is refused, naming it");
  return checks::failures() > 0 ? 1 : 0;
}
