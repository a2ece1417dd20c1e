// lf::EMA against a moving average computed by hand over one process's plain LibTorch run:
//   lf_ema_checks single|ddp|fsdp|model_parallel_ddp|model_parallel_fsdp
// single: one process over the whole batch, with a BatchNorm (buffers averaged, the integer
// counter truncated as AveragedModel does); ddp and fsdp (FULL_SHARD, two sharding units; the
// head's bias has one element, so rank 1's shard of it is empty) under lightning-run;
// model_parallel_* on 4 ranks, mesh (data 2, tensor 2) with ddp or fsdp (FULL_SHARD) on the data
// dimension, the first layer column-parallel and the second row-parallel (their weights split
// over the tensor group, fsdp's shards cut from those slices). Data rank d holds rows
// [4d, 4d + 4). 8 SGD steps (lr 0.1), EMA decay 0.9 updated every 2 steps from step 1 (steps 2,
// 4, 6). Checks, on every rank:
//   - the averaged weights (state_dict: full tensors, gathered over the shards and the tensor
//     group) equal the reference's within 1e-5 relative; n_averaged and step as counted;
//   - inside swap_into_model the model computes with the average, after it with its weights;
//   - a run saved after step 4 (model, optimizer, EMA) and resumed into a fresh model equals the
//     uninterrupted run bitwise, average and weights;
//   - an optimizer over other tensors does not count as a step; bad options are refused.
// Each rank prints "FAIL: ..." per failed check and exits 1 if any failed.
#include <torch/torch.h>

#include <iostream>

#include "expect.h"
#include "lightning/fabric.h"
#include "lightning/fabric/utilities/process.h"

namespace lf = lightning::fabric;
namespace tp = lightning::fabric::tensor_parallel;

namespace {
using checks::expect;
const auto refusal = [](auto&& fn) { return checks::refusal<std::exception>(fn); };

constexpr int64_t kLocalRows = 4;
constexpr int kSteps = 8;
constexpr int kSaveAfter = 4;
constexpr double kDecay = 0.9;
constexpr double kLearningRate = 0.1;

torch::nn::Sequential make_model(bool with_norm, uint64_t seed) {
  torch::manual_seed(seed);
  torch::nn::Sequential model;
  model->push_back(torch::nn::Linear(6, 16));
  if (with_norm) model->push_back(torch::nn::BatchNorm1d(16));
  model->push_back(torch::nn::Tanh());
  model->push_back(torch::nn::Linear(16, 16));
  model->push_back(torch::nn::Tanh());
  model->push_back(torch::nn::Linear(16, 1));
  return model;
}

bool split(const std::string& strategy) { return strategy == "model_parallel_ddp" || strategy == "model_parallel_fsdp"; }
bool sharded(const std::string& strategy) { return strategy == "fsdp" || strategy == "model_parallel_fsdp"; }

// make_model's (without the norm) with the first two layers tensor-parallel: the column layer's
// output features and the row layer's input features split over the tensor group at setup.
torch::nn::Sequential make_split_model(uint64_t seed) {
  auto plain = make_model(false, seed);
  torch::nn::Sequential model;
  model->push_back(tp::ColumnParallelLinear(tp::ParallelLinearOptions(6, 16)));
  model->push_back(torch::nn::Tanh());
  model->push_back(tp::RowParallelLinear(tp::ParallelLinearOptions(16, 16)));
  model->push_back(torch::nn::Tanh());
  model->push_back(torch::nn::Linear(16, 1));
  torch::NoGradGuard no_grad;
  const auto weights = plain->named_parameters();
  for (const auto& item : model->named_parameters()) item.value().copy_(weights[item.key()]);
  return model;
}

bool updates(int64_t step_idx) { return step_idx >= 1 && step_idx % 2 == 0; }

// One process, the whole batch: the weights after kSteps and their average, by AveragedModel's rule.
std::map<std::string, torch::Tensor> reference(bool with_norm, const torch::Tensor& x, const torch::Tensor& y,
                                               std::map<std::string, torch::Tensor>& weights) {
  auto model = make_model(with_norm, 5);
  torch::optim::SGD sgd(model->parameters(), kLearningRate);
  std::map<std::string, torch::Tensor> average;
  int64_t averaged = 0;
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    sgd.step();
    if (!updates(step)) continue;
    torch::NoGradGuard no_grad;
    for (const auto& item : model->named_parameters()) {
      auto& a = average["module." + item.key()];
      a = averaged == 0 ? item.value().clone() : a * kDecay + item.value() * (1.0 - kDecay);
    }
    for (const auto& item : model->named_buffers()) {
      auto& a = average["module." + item.key()];
      a = averaged == 0 ? item.value().clone() : (a * kDecay + item.value() * (1.0 - kDecay)).to(item.value().scalar_type());
    }
    ++averaged;
  }
  for (const auto& item : model->named_parameters()) weights[item.key()] = item.value().detach().clone();
  for (const auto& item : model->named_buffers()) weights[item.key()] = item.value().detach().clone();
  return average;
}

bool close(const torch::Tensor& actual, const torch::Tensor& expected) {
  if (actual.sizes() != expected.sizes()) return false;
  const double scale = std::max(1e-2, expected.abs().max().item<double>());
  return (actual.to(torch::kDouble) - expected.to(torch::kDouble)).abs().max().item<double>() <= 1e-5 * scale;
}

// The module's full weights on every rank (gathered under fsdp, and over the tensor group where split).
std::map<std::string, torch::Tensor> full_weights(lf::Fabric& fabric, const std::string& strategy,
                                                  torch::nn::Sequential& model) {
  lf::ScopeGuard full;
  if (sharded(strategy)) full = fabric.strategy_as<lf::FSDPStrategy>().summon_full_parameters(*model);
  std::map<const c10::TensorImpl*, int64_t> split_dims;
  for (const auto& part : tp::sharded_parameters_of(*model)) split_dims[part.tensor.unsafeGetTensorImpl()] = part.dim;
  std::map<std::string, torch::Tensor> weights;
  for (const auto& item : model->named_parameters()) {
    torch::Tensor value = item.value().detach().clone();
    auto dim = split_dims.find(item.value().unsafeGetTensorImpl());
    if (dim != split_dims.end()) {
      value = tp::gather_from_tensor_region(value, *fabric.strategy_as<lf::MeshStrategy>().device_mesh(), dim->second);
    }
    weights[item.key()] = value;
  }
  for (const auto& item : model->named_buffers()) weights[item.key()] = item.value().detach().clone();
  return weights;
}

struct Run {
  lf::Fabric& fabric;
  std::string strategy;
  std::shared_ptr<lf::EMA> ema;
  int data_rank;       // the rows this rank reads (the ranks of a tensor group read the same)
  torch::Tensor x, y;  // the global batch
  torch::Tensor local_x() const {
    if (strategy == "single") return x;
    return x.narrow(0, kLocalRows * data_rank, kLocalRows);
  }
  torch::Tensor local_y() const {
    if (strategy == "single") return y;
    return y.narrow(0, kLocalRows * data_rank, kLocalRows);
  }
};

template <class Model>
void train(Run& run, Model& model, lf::FabricOptimizer& optimizer, int from, int to) {
  for (int step = from; step < to; ++step) {
    optimizer.zero_grad();
    run.fabric.backward(torch::mse_loss(model(run.local_x()), run.local_y()));
    optimizer.step();
  }
}
}  // namespace

int main(int argc, char** argv) {
  const std::string strategy = argc > 1 ? argv[1] : "single";
  auto ema = std::make_shared<lf::EMA>(lf::EMAOptions().with_decay(kDecay).every_n_steps(2).starting_at_step(1));
  lf::FabricOptions options = lf::FabricOptions().accelerator("cpu").callback(ema);
  if (strategy == "fsdp") {
    lf::FSDPOptions fsdp;
    fsdp.auto_wrap_min_params = 100;  // the two larger layers become units; the head stays
    options.strategy(lf::fsdp_strategy(fsdp));
  } else if (split(strategy)) {
    lf::ModelParallelOptions parallel;  // the default parallelize splits both tensor-parallel layers
    parallel.tensor_parallel_size = 2;
    parallel.data_parallel_strategy = strategy == "model_parallel_fsdp" ? "fsdp" : "ddp";
    options.strategy(lf::model_parallel_strategy(parallel));
  } else {
    options.strategy(strategy == "single" ? "single_device" : strategy);
  }
  lf::Fabric fabric(options);
  const bool with_norm = strategy == "single";
  const lf::Strategy::SamplerShare share = fabric.strategy()->sampler_share();
  const int64_t rows = kLocalRows * (strategy == "single" ? 2 : share.replicas);
  torch::manual_seed(3);
  Run run{fabric, strategy, ema, share.rank, torch::randn({rows, 6}), torch::randn({rows, 1})};
  std::map<std::string, torch::Tensor> expected_weights;
  const auto expected = reference(with_norm, run.x, run.y, expected_weights);

  // The uninterrupted run, saved after kSaveAfter steps.
  const std::string folder = fabric.broadcast(fabric.is_global_zero() ? lf::make_temporary_directory("lf-ema") : "");
  const std::string path = folder + "/resume.ckpt";
  auto net = split(strategy) ? make_split_model(5) : make_model(with_norm, 5);
  torch::optim::SGD sgd(net->parameters(), kLearningRate);
  auto [model, optimizer] = fabric.setup(net, sgd);
  expect(!split(strategy) || tp::sharded_parameters_of(*net).size() == 3,
         "the tensor-parallel plan split the column layer's weight and bias and the row layer's weight");
  train(run, model, optimizer, 0, kSaveAfter);
  fabric.save(path, {{"model", model}, {"optimizer", optimizer}, {"ema", ema}});
  train(run, model, optimizer, kSaveAfter, kSteps);

  const lf::StateDict state = ema->state_dict();  // collective under fsdp and model_parallel
  for (const auto& [key, value] : expected) {
    expect(state.contains(key) && close(state.at(key).toTensor(), value), "the average of " + key + " equals the reference's");
  }
  expect(ema->n_averaged() == 3 && ema->step() == kSteps, "n_averaged " + std::to_string(ema->n_averaged()) + " (3), step " +
                                                              std::to_string(ema->step()) + " (8)");
  const auto weights = full_weights(fabric, strategy, net);
  for (const auto& [name, value] : expected_weights) expect(close(weights.at(name), value), "the weight " + name + " equals the reference's");

  // The model computes with the average inside the guard, with its weights after it.
  {
    torch::NoGradGuard no_grad;
    auto averaged = make_model(with_norm, 5);
    for (const auto& item : averaged->named_parameters()) item.value().copy_(expected.at("module." + item.key()));
    for (const auto& item : averaged->named_buffers()) item.value().copy_(expected.at("module." + item.key()));
    averaged->eval();
    net->eval();
    {
      auto swapped = ema->swap_into_model();
      expect(close(model(run.local_x()), averaged->forward(run.local_x())), "inside swap_into_model the model uses the average");
    }
    const auto after = full_weights(fabric, strategy, net);
    for (const auto& [name, value] : expected_weights) expect(torch::equal(after.at(name), weights.at(name)), "swapped back: " + name);
    net->train();
  }

  // Resumed into a fresh model: the same average and weights, bit for bit.
  auto fresh = split(strategy) ? make_split_model(77) : make_model(with_norm, 77);
  torch::optim::SGD fresh_sgd(fresh->parameters(), kLearningRate);
  auto [resumed, resumed_optimizer] = fabric.setup(fresh, fresh_sgd);
  ema->follow(fresh.ptr(), *fabric.strategy());
  lf::State resume{{"model", resumed}, {"optimizer", resumed_optimizer}, {"ema", ema}};
  fabric.load(path, resume);
  expect(ema->step() == kSaveAfter && ema->n_averaged() == 1, "the EMA's counters come back from the checkpoint");
  train(run, resumed, resumed_optimizer, kSaveAfter, kSteps);
  const lf::StateDict again = ema->state_dict();
  bool same = ema->n_averaged() == 3;
  for (const auto& [key, value] : expected) same = same && torch::equal(again.at(key).toTensor(), state.at(key).toTensor());
  expect(same, "the resumed run's average equals the uninterrupted run's bit for bit");
  const auto resumed_weights = full_weights(fabric, strategy, fresh);
  for (const auto& [name, value] : weights) expect(torch::equal(resumed_weights.at(name), value), "resumed weight " + name);

  // An optimizer over other tensors is not the model's step; bad options are refused.
  auto other = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD other_sgd(std::vector<torch::Tensor>{other}, kLearningRate);
  ema->on_after_optimizer_step({{"strategy", fabric.strategy().get()}, {"optimizer", static_cast<torch::optim::Optimizer*>(&other_sgd)}});
  expect(ema->step() == kSteps, "another optimizer's step is not counted");
  expect(refusal([] { lf::EMA(lf::EMAOptions().with_decay(1.5)); }).find("decay is 1.5") != std::string::npos,
         "a decay outside [0, 1] is refused");
  expect(refusal([] { auto guard = lf::EMA().swap_into_model(); }).find("no module to average") != std::string::npos,
         "swap_into_model before any module is refused with the fix");
  fabric.barrier();
  if (fabric.is_global_zero()) std::filesystem::remove_all(folder);
  if (checks::failures() > 0) return 1;
  std::cout << "rank " << fabric.global_rank() << ": EMA checks pass under " << strategy << std::endl;
  return 0;
}
