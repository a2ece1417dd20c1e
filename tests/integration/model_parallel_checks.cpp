// The model_parallel strategy in a real job under lightning-run: a small language model built from
// tensor-parallel layers (a vocabulary-parallel embedding, a column- then row-parallel MLP, a
// column-parallel head and the vocabulary-parallel loss) trains 20 SGD steps with gradient
// clipping on one global batch split by the data rank. Every rank compares its parameters with
// the same model trained unsplit in this process on the whole batch (float32, within 1e-5), and
// checks the mesh, the sampler's share and the clipped norm. Prints "FAIL: ..." and exits 1 on a
// mismatch, "model parallel checks passed on rank R (data D of S, tensor T of U)" otherwise.
//   lightning-run model --accelerator cpu --devices 4 lf_model_parallel_checks [--tensor N]
// --tensor N configures model_parallel_strategy in code; without it the strategy comes from
// lightning-run --strategy model_parallel (tensor size = the devices per node).
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "lightning/fabric.h"

namespace lf = lightning::fabric;
namespace tp = lightning::fabric::tensor_parallel;

namespace {
constexpr int64_t kVocab = 16, kWidth = 8, kHidden = 16, kTokens = 12, kSteps = 20;

struct TinyLanguageModelImpl : torch::nn::Module {
  TinyLanguageModelImpl() {
    embedding = register_module("embedding", tp::VocabParallelEmbedding(kVocab, kWidth));
    up = register_module("up", tp::ColumnParallelLinear(tp::ParallelLinearOptions(kWidth, kHidden)));
    down = register_module("down", tp::RowParallelLinear(tp::ParallelLinearOptions(kHidden, kWidth)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})));
    auto head_options = tp::ParallelLinearOptions(kWidth, kVocab);
    head_options.bias = false;
    head = register_module("head", tp::ColumnParallelLinear(head_options));
  }
  // Logits over this rank's vocabulary columns (all of them when unsplit).
  at::Tensor forward(const at::Tensor& ids) {
    const at::Tensor x = embedding(ids);
    return head(norm(x + down(torch::tanh(up(x)))));
  }
  tp::VocabParallelEmbedding embedding{nullptr};
  tp::ColumnParallelLinear up{nullptr}, head{nullptr};
  tp::RowParallelLinear down{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(TinyLanguageModel);

// Step s's global batch of next-token pairs.
std::pair<at::Tensor, at::Tensor> batch(int64_t step) {
  torch::manual_seed(500 + step);
  const at::Tensor ids = torch::randint(kVocab, {kTokens});
  return {ids, (ids * 3 + 1) % kVocab};
}

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::cout << "FAIL: " << what << std::endl;
  ++failures;
}

// The full tensor of a parameter that `module` holds a slice of along dim (or whole: dim < 0).
at::Tensor whole(const at::Tensor& part, const lf::DeviceMesh& mesh, int64_t dim) {
  if (dim < 0 || mesh.tensor_size() == 1) return part.detach();
  return lf::tensor_parallel::gather_from_tensor_region(part.detach(), mesh, dim);
}
}  // namespace

int main(int argc, char** argv) {
  lf::FabricOptions options;
  options.accelerator("cpu");
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--tensor") {
      lf::ModelParallelOptions model_parallel;
      model_parallel.tensor_parallel_size = std::atoi(argv[i + 1]);
      options.strategy(lf::model_parallel_strategy(model_parallel));
    }
  }
  lf::Fabric fabric(options);
  auto& strategy = fabric.strategy_as<lf::ModelParallelStrategy>();
  lf::Fabric::seed_everything(3);
  TinyLanguageModel reference;
  lf::Fabric::seed_everything(3);
  TinyLanguageModel net;
  torch::optim::SGD reference_sgd(reference->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
  auto [model, optimizer] = fabric.setup(net, sgd);  // builds the mesh, shards the layers
  const lf::DeviceMesh& mesh = *strategy.device_mesh();
  const int rank = fabric.global_rank(), data = mesh.data_size(), tensor = mesh.tensor_size();
  expect(strategy.name() == "model_parallel", "the strategy is called " + strategy.name());
  expect(mesh.data_size() * tensor == fabric.world_size(), "the mesh covers the world");
  const auto share = strategy.sampler_share();
  expect(share.replicas == data && share.rank == mesh.data_rank(), "the sampler splits by the data rank");
  expect(net->up->weight.size(0) == kHidden / tensor && net->down->weight.size(1) == kHidden / tensor,
         "the layers hold 1/tensor of their weights");

  const int64_t rows = kTokens / data;
  double last_norm = 0, last_reference_norm = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    auto [ids, targets] = batch(step);
    optimizer.zero_grad();
    const at::Tensor mine = ids.narrow(0, mesh.data_rank() * rows, rows);
    const at::Tensor logits = model(mine);
    fabric.backward(tp::vocab_parallel_cross_entropy(logits, targets.narrow(0, mesh.data_rank() * rows, rows), mesh));
    last_norm = fabric.clip_gradients(model, optimizer, lf::GradientClipping().norm(1.0))->item<double>();
    optimizer.step();

    reference_sgd.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(ids), targets).backward();
    std::vector<at::Tensor> parameters = reference->parameters();
    last_reference_norm = torch::nn::utils::clip_grad_norm_(parameters, 1.0);
    reference_sgd.step();
  }
  expect(std::abs(last_norm - last_reference_norm) <= 1e-5 * std::max(1.0, last_reference_norm),
         "the clipped norm " + std::to_string(last_norm) + " differs from the unsplit model's " +
             std::to_string(last_reference_norm));
  const std::vector<std::pair<at::Tensor, at::Tensor>> compared = {
      {whole(net->embedding->weight, mesh, 0), reference->embedding->weight},
      {whole(net->up->weight, mesh, 0), reference->up->weight},
      {whole(net->up->bias, mesh, 0), reference->up->bias},
      {whole(net->down->weight, mesh, 1), reference->down->weight},
      {whole(net->down->bias, mesh, -1), reference->down->bias},
      {whole(net->norm->weight, mesh, -1), reference->norm->weight},
      {whole(net->head->weight, mesh, 0), reference->head->weight}};
  double worst = 0;
  for (const auto& [ours, theirs] : compared) {
    worst = std::max(worst, (ours - theirs.detach()).abs().max().item<double>());
  }
  expect(worst <= 1e-5, "the parameters differ from the unsplit model's by " + std::to_string(worst));
  if (failures > 0) return 1;
  std::cout << "model parallel checks passed on rank " << rank << " (data " << mesh.data_rank() << " of " << data
            << ", tensor " << mesh.tensor_rank() << " of " << tensor << "), largest difference " << worst << std::endl;
  return 0;
}
