// The tensor-parallel layers, regions and loss on 2 and 4 ranks (threads of this process on
// gloo): each split layer, built from the full one, gives the full layer's output, and its
// gradients are the full gradients' slices. The references are computed in the calling thread
// (LibTorch's random generator is one per process).
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include "../thread_ranks.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/strategies/device_mesh.h"
#include "lightning/fabric/tensor_parallel/cross_entropy.h"
#include "lightning/fabric/tensor_parallel/layers.h"
#include "lightning/fabric/tensor_parallel/regions.h"

namespace lf = lightning::fabric;
namespace tp = lightning::fabric::tensor_parallel;

namespace {
bool close(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && at::allclose(a, b, 1e-5, 1e-6); }

template <class Body>
void on_ranks(int count, Body body) {
  const auto failures = lf_test::on_thread_ranks(count, [&](lf::Collective& world, lf_test::RankChecks& checks) {
    auto mesh = std::make_shared<lf::DeviceMesh>(world, std::vector<lf::MeshDimension>{{"data", 1}, {"tensor", count}});
    body(mesh, checks);
    // No rank tears its groups down while another still connects to them (gloo's handshakes).
    world.barrier();
  });
  CHECK(failures == std::vector<std::string>());
}

// A full MLP in -> hidden -> in and its gradients for loss = sum(output^2).
struct MlpReference {
  torch::nn::Linear up{nullptr}, down{nullptr};
  at::Tensor input, output, input_grad;
  MlpReference(int64_t batch, int64_t sequence, int64_t features, int64_t hidden) {
    torch::manual_seed(11);
    up = torch::nn::Linear(features, hidden);
    down = torch::nn::Linear(hidden, features);
    input = torch::randn({batch, sequence, features}, torch::requires_grad());
    output = down(torch::tanh(up(input)));
    output.pow(2).sum().backward();
    input_grad = input.grad().clone();
  }
};
}  // namespace

TEST_CASE("tensor parallel: column then row parallel Linear equal the full MLP, gradients included", "[tensor_parallel]") {
  for (int ranks : {2, 4}) {
    const MlpReference reference(3, 4, 6, 8);
    on_ranks(ranks, [&](const std::shared_ptr<lf::DeviceMesh>& mesh, lf_test::RankChecks& checks) {
      const std::string who = std::to_string(ranks) + " ranks, rank " + std::to_string(mesh->coordinate("tensor")) + ": ";
      tp::ColumnParallelLinear up(mesh, reference.up, tp::ParallelLinearOptions(6, 8));
      tp::RowParallelLinear down(mesh, reference.down, tp::ParallelLinearOptions(8, 6));
      const at::Tensor input = reference.input.detach().clone().requires_grad_(true);
      const at::Tensor output = down(torch::tanh(up(input)));
      checks.expect(close(output, reference.output.detach()), who + "output");
      output.pow(2).sum().backward();
      checks.expect(close(input.grad(), reference.input_grad), who + "input gradient (the copy region's all-reduce)");
      checks.expect(close(up->weight.grad(), tp::tensor_slice(reference.up->weight.grad(), *mesh, 0)), who + "column weight");
      checks.expect(close(up->bias.grad(), tp::tensor_slice(reference.up->bias.grad(), *mesh, 0)), who + "column bias");
      checks.expect(close(down->weight.grad(), tp::tensor_slice(reference.down->weight.grad(), *mesh, 1)), who + "row weight");
      checks.expect(close(down->bias.grad(), reference.down->bias.grad()), who + "row bias, added once");
    });
  }
}

TEST_CASE("tensor parallel: a gathered column output into a row layer that scatters its input", "[tensor_parallel]") {
  const MlpReference reference(2, 3, 4, 8);
  on_ranks(4, [&](const std::shared_ptr<lf::DeviceMesh>& mesh, lf_test::RankChecks& checks) {
    auto up_options = tp::ParallelLinearOptions(4, 8);
    up_options.gather_output = true;
    auto down_options = tp::ParallelLinearOptions(8, 4);
    down_options.input_is_parallel = false;
    tp::ColumnParallelLinear up(mesh, reference.up, up_options);
    tp::RowParallelLinear down(mesh, reference.down, down_options);
    const at::Tensor input = reference.input.detach().clone().requires_grad_(true);
    const at::Tensor hidden = up(input);
    checks.expect(hidden.size(-1) == 8, "the gathered output has every feature");
    const at::Tensor output = down(torch::tanh(hidden));
    checks.expect(close(output, reference.output.detach()), "output");
    output.pow(2).sum().backward();
    checks.expect(close(input.grad(), reference.input_grad), "input gradient");
    checks.expect(close(up->weight.grad(), tp::tensor_slice(reference.up->weight.grad(), *mesh, 0)), "column weight");
  });
}

TEST_CASE("tensor parallel: sequence parallelism around the MLP equals the full MLP on each slice", "[tensor_parallel]") {
  const MlpReference reference(2, 4, 6, 8);
  on_ranks(2, [&](const std::shared_ptr<lf::DeviceMesh>& mesh, lf_test::RankChecks& checks) {
    auto up_options = tp::ParallelLinearOptions(6, 8);
    up_options.sequence_dim = 1;
    auto down_options = tp::ParallelLinearOptions(8, 6);
    down_options.sequence_dim = 1;
    tp::ColumnParallelLinear up(mesh, reference.up, up_options);
    tp::RowParallelLinear down(mesh, reference.down, down_options);
    const at::Tensor input = tp::tensor_slice(reference.input.detach(), *mesh, 1).requires_grad_(true);
    const at::Tensor output = down(torch::tanh(up(input)));
    checks.expect(close(output, tp::tensor_slice(reference.output.detach(), *mesh, 1)), "this rank's output slice");
    output.pow(2).sum().backward();  // this rank's part of the loss; the regions add the parts
    checks.expect(close(input.grad(), tp::tensor_slice(reference.input_grad, *mesh, 1)), "input slice gradient");
    checks.expect(close(up->weight.grad(), tp::tensor_slice(reference.up->weight.grad(), *mesh, 0)), "column weight");
    checks.expect(close(down->weight.grad(), tp::tensor_slice(reference.down->weight.grad(), *mesh, 1)), "row weight");
    checks.expect(close(down->bias.grad(), reference.down->bias.grad()), "row bias: the slices' parts summed");
  });
}

TEST_CASE("tensor parallel: a sequence-parallel LayerNorm sums its weights' gradient parts over the group",
          "[tensor_parallel]") {
  torch::manual_seed(5);
  const at::Tensor input = torch::randn({2, 4, 6});
  const at::Tensor upstream = torch::randn({2, 4, 6});
  tp::ParallelLayerNormOptions options({6});
  options.sequence_parallel = true;
  tp::ParallelLayerNorm full(options);  // no mesh: torch's LayerNorm
  {
    torch::NoGradGuard no_grad;
    full->weight.uniform_(0.5, 1.5);
    full->bias.uniform_(-0.5, 0.5);
  }
  const at::Tensor whole_input = input.clone().requires_grad_(true);
  const at::Tensor expected = full(whole_input);
  CHECK(close(expected, torch::layer_norm(input, {6}, full->weight.detach(), full->bias.detach())));
  (expected * upstream).sum().backward();
  on_ranks(2, [&](const std::shared_ptr<lf::DeviceMesh>& mesh, lf_test::RankChecks& checks) {
    tp::ParallelLayerNorm norm(options, mesh);
    {
      torch::NoGradGuard no_grad;
      norm->weight.copy_(full->weight);
      norm->bias.copy_(full->bias);
    }
    const at::Tensor output = norm(tp::tensor_slice(input, *mesh, 1));
    checks.expect(close(output, tp::tensor_slice(expected.detach(), *mesh, 1)), "this rank's normalised slice");
    (output * tp::tensor_slice(upstream, *mesh, 1)).sum().backward();
    checks.expect(close(norm->weight.grad(), full->weight.grad()), "the whole weight gradient on every rank");
    checks.expect(close(norm->bias.grad(), full->bias.grad()), "the whole bias gradient on every rank");
    checks.expect(tp::sharded_parameters_of(*norm).empty(), "nothing split");
  });
  CHECK_THROWS_AS(tp::ParallelDropout(1.0), lf::ValueError);
}

TEST_CASE("tensor parallel: the vocabulary-parallel embedding equals the full one", "[tensor_parallel]") {
  torch::manual_seed(5);
  torch::nn::Embedding full(8, 3);
  const at::Tensor ids = torch::randint(8, {4, 5});
  const at::Tensor weights = torch::randn({4, 5, 3});
  const at::Tensor expected = full(ids);
  (expected * weights).sum().backward();
  on_ranks(4, [&](const std::shared_ptr<lf::DeviceMesh>& mesh, lf_test::RankChecks& checks) {
    tp::VocabParallelEmbedding embedding(mesh, full);
    checks.expect(embedding->vocab_start() == 2 * mesh->coordinate("tensor") && embedding->weight.size(0) == 2, "rows held");
    const at::Tensor output = embedding(ids);
    checks.expect(close(output, expected.detach()), "output");
    (output * weights).sum().backward();
    checks.expect(close(embedding->weight.grad(), tp::tensor_slice(full->weight.grad(), *mesh, 0)), "weight gradient");
  });
}

TEST_CASE("tensor parallel: the vocabulary-parallel cross-entropy equals torch's on the gathered logits",
          "[tensor_parallel]") {
  torch::manual_seed(9);
  const at::Tensor logits = (torch::randn({6, 8}) * 3).requires_grad_(true);
  const at::Tensor targets = torch::randint(8, {6});
  const at::Tensor expected = torch::nn::functional::cross_entropy(logits, targets);
  expected.backward();
  const at::Tensor expected_rows =
      torch::nn::functional::cross_entropy(logits.detach(), targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  on_ranks(2, [&](const std::shared_ptr<lf::DeviceMesh>& mesh, lf_test::RankChecks& checks) {
    const at::Tensor local = tp::tensor_slice(logits.detach(), *mesh, -1).requires_grad_(true);
    const at::Tensor loss = tp::vocab_parallel_cross_entropy(local, targets, *mesh);
    checks.expect(close(loss, expected.detach()), "the mean loss");
    loss.backward();
    checks.expect(close(local.grad(), tp::tensor_slice(logits.grad(), *mesh, -1)), "this rank's logit gradients");
    checks.expect(close(tp::vocab_parallel_cross_entropy(local.detach(), targets, *mesh, "none"), expected_rows), "per row");
    const auto error_of = [&](const at::Tensor& bad_targets, const std::string& reduction) -> std::string {
      try {
        tp::vocab_parallel_cross_entropy(local.detach(), bad_targets, *mesh, reduction);
      } catch (const lf::ValueError& error) {
        return error.what();
      }
      return "no error";
    };
    checks.expect(error_of(targets, "average").find("reduction=\"average\" is not supported") != std::string::npos,
                  "a bad reduction");
    checks.expect(error_of(torch::full({6}, 8, torch::kLong), "mean").find("outside [0, 8)") != std::string::npos,
                  "a target outside the vocabulary");
  });
}

TEST_CASE("tensor parallel: a feature count that does not split is a ValueError naming both", "[tensor_parallel]") {
  torch::manual_seed(1);
  torch::nn::Linear odd(4, 6);
  on_ranks(4, [&](const std::shared_ptr<lf::DeviceMesh>& mesh, lf_test::RankChecks& checks) {
    try {
      tp::ColumnParallelLinear column(mesh, odd, tp::ParallelLinearOptions(4, 6));
      (void)column;
      checks.expect(false, "6 output features were split 4 ways");
    } catch (const lf::ValueError& error) {
      checks.expect(std::string(error.what()).find("out_features=6 does not split into 4 equal parts") != std::string::npos,
                    error.what());
    }
  });
}
