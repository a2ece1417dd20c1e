// FabricOptions::detect_nonfinite under lightning-run (2 ranks; argv[1]: ddp or fsdp): planted
// non-finite values must be found and named on every rank, and clean steps must pass.
//   - an overflow planted in module fc2's weights on rank 1 at step 3: NonFiniteError on every
//     rank at step 3, ranks() == {1}, naming aten::mul in module 'fc2';
//   - a NaN loss made outside the modules on rank 0 (log of -1): names the loss and rank 0;
//   - gradients made non-finite on rank 1 by a square root at 0 while the forward stays finite:
//     caught before the gradient reduction, naming rank 1, the step and module 'fc2';
//   - a NaN in the branch torch::where drops on rank 0 (finite loss, NaN gradients): names
//     aten::sqrt with module 'fc1' and rank 0;
//   - then clean steps whose forward masks scores with -inf (as attention does): no error;
//   - rollback (fabric.roll_back_on_bad_steps): before any checkpoint the overflow still throws,
//     saying there is none; after fabric.save it rolls every rank back to the saved weights and the
//     step changes nothing, and the next clean steps train on.
// Each rank prints "FAIL: ..." per failed check and exits 1 if any failed.
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <limits>

#include "expect.h"
#include "lightning/fabric.h"

namespace lf = lightning::fabric;
using checks::expect;

namespace {
struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 4))) {}
  torch::Tensor forward(const torch::Tensor& x, bool overflow, bool masked = false, bool dropped_nan = false) {
    auto hidden = torch::relu(fc1(x));
    if (dropped_nan) {  // NaN in the branch torch::where drops: the loss stays finite, the gradients do not
      hidden = torch::where(hidden > 1e6, torch::sqrt(hidden - 1e6), hidden);
    }
    if (masked) {  // an attention-style mask: -inf scores on purpose, a finite softmax
      auto scores = hidden.index_fill(1, torch::tensor({int64_t{0}}), -std::numeric_limits<float>::infinity());
      hidden = hidden + torch::softmax(scores, 1);
    }
    if (overflow) return torch::nn::functional::linear(hidden, fc2->weight * 1e30f * 1e30f, fc2->bias);
    return fc2(hidden);
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Runs steps 0..last; plant(step, rank) says what to plant. Returns the error's message ("" if none).
template <class Model, class Optimizer, class Loss>
std::string run(lf::Fabric& fabric, Model& model, Optimizer& optimizer, int last, Loss loss_of, int64_t& error_step,
                std::vector<int>& error_ranks) {
  for (int step = 0; step <= last; ++step) {
    optimizer.zero_grad();
    const auto x = torch::randn({6, 8});
    try {
      fabric.backward(loss_of(step, x));
    } catch (const lf::NonFiniteError& error) {
      error_step = error.step();
      error_ranks = error.ranks();
      return error.what();
    }
    optimizer.step();
  }
  return "";
}
}  // namespace

int main(int argc, char** argv) {
  const std::string strategy = argc > 1 ? argv[1] : "ddp";
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy(strategy).detect_nonfinite(true));
  fabric.seed_everything(5);
  const int rank = fabric.global_rank();
  Net net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));  // state for the rollback to restore
  auto setup = fabric.setup(net, sgd);  // (C++17 lambdas cannot capture structured bindings)
  auto& model = std::get<0>(setup);
  auto& optimizer = std::get<1>(setup);
  int64_t step = -1;
  std::vector<int> ranks;

  std::string message = run(fabric, model, optimizer, 5, [&](int at, const at::Tensor& x) {
    return model(x, /*overflow=*/at == 3 && rank == 1).pow(2).mean();
  }, step, ranks);
  std::cout << "rank " << rank << " overflow: " << message << std::endl;
  expect(step == 3, "the planted overflow is found at step 3, got step " + std::to_string(step));
  expect(ranks == std::vector<int>{1}, "the planted overflow names rank 1 alone");
  expect(contains(message, "rank 1: the output of aten::mul, in the forward, module 'fc2'"),
         "the planted overflow names aten::mul in module 'fc2' on rank 1, got: " + message);
  expect(!contains(message, "\n  rank 0:"), "rank 0's gradients are named as the reduction's echo only, got: " + message);

  message = run(fabric, model, optimizer, 3, [&](int at, const at::Tensor& x) {
    auto loss = model(x, false).pow(2).mean();
    return at == 1 && rank == 0 ? loss + torch::log(torch::tensor(-1.0f)) : loss;
  }, step, ranks);
  std::cout << "rank " << rank << " loss: " << message << std::endl;
  expect(step == 4 + 1, "the NaN loss is found at the second step of this run (call 5), got " + std::to_string(step));
  expect(ranks == std::vector<int>{0}, "the NaN loss names rank 0 alone");
  expect(contains(message, "rank 0: the loss, while every operation of the set-up modules' forward gave finite values"),
         "the NaN loss is named as the loss's, got: " + message);

  message = run(fabric, model, optimizer, 1, [&](int at, const at::Tensor& x) {
    if (at == 1 && rank == 1) return (model(x, false) * 0).abs().sqrt().sum();
    return model(x, false).pow(2).mean();
  }, step, ranks);
  std::cout << "rank " << rank << " gradients: " << message << std::endl;
  expect(step == 6 + 1, "the non-finite gradients are found at the second step of this run (call 7), got " +
                            std::to_string(step));
  expect(ranks == std::vector<int>{1}, "non-finite gradients name rank 1, where the backward produced them");
  expect(contains(message, "at step 7 ") && contains(message, "the first non-finite value appeared on rank 1") &&
             contains(message, "rank 1: the gradient of 'fc2.") && contains(message, "module 'fc2'") &&
             contains(message, "before the gradient reduction"),
         "non-finite gradients are named by rank 1, the step and module 'fc2', got: " + message);
  expect(!contains(message, "\n  rank 0:") && contains(message, "(rank 0: non-finite gradients, received through"),
         "rank 0 received the gradients through the reduction only, got: " + message);

  message = run(fabric, model, optimizer, 0, [&](int, const at::Tensor& x) {
    return model(x, false, false, /*dropped_nan=*/rank == 0).pow(2).mean();
  }, step, ranks);
  std::cout << "rank " << rank << " dropped NaN: " << message << std::endl;
  expect(ranks == std::vector<int>{0}, "a NaN the loss did not see names rank 0, where it began");
  expect(contains(message, "rank 0: the output of aten::sqrt, in the forward, ") && contains(message, "module 'fc1'") &&
             contains(message, "the loss stayed finite"),
         "a NaN the loss did not see is named at aten::sqrt with module 'fc1', got: " + message);

  message = run(fabric, model, optimizer, 4, [&](int, const at::Tensor& x) { return model(x, false, true).pow(2).mean(); },
                step, ranks);
  expect(message.empty(), "clean steps with a -inf mask in the forward pass, got: " + message);

  lf::State state{{"model", model}, {"optimizer", optimizer}, {"step", int64_t{0}}};
  fabric.roll_back_on_bad_steps(state);
  const auto overflow_at_0 = [&](int at, const at::Tensor& x) { return model(x, /*overflow=*/at == 0 && rank == 1).pow(2).mean(); };
  message = run(fabric, model, optimizer, 0, overflow_at_0, step, ranks);
  expect(contains(message, "there is no checkpoint to roll back to") && contains(message, "module 'fc2'"),
         "without a checkpoint the finding is thrown, saying so, got: " + message);
  const auto checkpoint = std::filesystem::temp_directory_path() /
                          ("lf_nonfinite_rollback_" + std::to_string(::getppid()) + "_" + strategy);
  fabric.save(checkpoint, state);
  const auto trained = [&] {
    std::vector<at::Tensor> copies;
    for (const auto& group : optimizer.param_groups()) {
      for (const auto& parameter : group.params()) copies.push_back(parameter.detach().clone());
    }
    return copies;
  };
  const auto same = [](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    bool equal = a.size() == b.size();
    for (size_t i = 0; equal && i < a.size(); ++i) equal = torch::equal(a[i], b[i]);
    return equal;
  };
  const std::vector<at::Tensor> saved = trained();
  // Moves the weights away from the checkpoint first, so that the rollback has something to undo.
  message = run(fabric, model, optimizer, 1, [&](int, const at::Tensor& x) { return model(x, false).pow(2).mean(); }, step, ranks);
  expect(message.empty() && !same(trained(), saved), "two clean steps train after the save");
  expect(fabric.rollback_checkpoint() == checkpoint, "the checkpoint to roll back to is the one saved");
  message = run(fabric, model, optimizer, 0, overflow_at_0, step, ranks);
  expect(message.empty(), "with a checkpoint the overflow rolls back instead of throwing, got: " + message);
  expect(same(trained(), saved), "after the rollback and its optimizer step, every rank holds the saved weights");
  message = run(fabric, model, optimizer, 1, [&](int, const at::Tensor& x) { return model(x, false).pow(2).mean(); }, step, ranks);
  expect(message.empty() && !same(trained(), saved), "training goes on after the rollback");
  fabric.stop_rolling_back();
  message = run(fabric, model, optimizer, 0, overflow_at_0, step, ranks);
  expect(contains(message, "module 'fc2'") && !contains(message, "roll back"), "rollback off again: the finding is thrown");
  fabric.barrier();
  if (fabric.is_global_zero()) std::filesystem::remove_all(checkpoint);

  if (checks::failures() > 0) return 1;
  std::cout << "rank " << rank << ": nonfinite checks pass (" << strategy << ")" << std::endl;
  return 0;
}
