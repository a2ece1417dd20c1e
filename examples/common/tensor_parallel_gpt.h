// A GPT-style language model built from tensor-parallel layers (docs/model-parallel.md): token
// embedding split by vocabulary, pre-norm blocks whose attention has q, k and v column-parallel
// (each rank of the tensor group computes its own heads) and the output projection row-parallel,
// an MLP column- then row-parallel, and a column-parallel head whose logits stay split by
// vocabulary for tp::vocab_parallel_cross_entropy. Until a mesh splits its layers (the
// model_parallel strategy's setup) it is the ordinary unsplit model, so the same code trains
// under every strategy. Used by examples/tensor_parallel_gpt and the model_parallel tests.
#pragma once

#include <lightning/fabric.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace examples {

namespace tp = lightning::fabric::tensor_parallel;

struct TensorParallelGptSettings {
  int64_t vocab = 256, seq = 32, d_model = 64, heads = 4, layers = 2;
};

struct TensorParallelBlockImpl : torch::nn::Module {
  TensorParallelBlockImpl(int64_t d, int64_t heads) : head_dim(d / heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    q = register_module("q", tp::ColumnParallelLinear(tp::ParallelLinearOptions(d, d)));
    k = register_module("k", tp::ColumnParallelLinear(tp::ParallelLinearOptions(d, d)));
    v = register_module("v", tp::ColumnParallelLinear(tp::ParallelLinearOptions(d, d)));
    projection = register_module("projection", tp::RowParallelLinear(tp::ParallelLinearOptions(d, d)));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc1 = register_module("fc1", tp::ColumnParallelLinear(tp::ParallelLinearOptions(d, 4 * d)));
    fc2 = register_module("fc2", tp::RowParallelLinear(tp::ParallelLinearOptions(4 * d, d)));
  }
  // x: [B, L, D], full on every rank of the tensor group.
  at::Tensor forward(at::Tensor x) {
    const int64_t batch = x.size(0), length = x.size(1);
    const at::Tensor h = ln1(x);
    // This rank's heads: [B, heads/T, L, head_dim].
    auto heads_of = [&](const at::Tensor& t) { return t.view({batch, length, -1, head_dim}).transpose(1, 2); };
    const at::Tensor attended = at::scaled_dot_product_attention(heads_of(q(h)), heads_of(k(h)), heads_of(v(h)),
                                                                 /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
    x = x + projection(attended.transpose(1, 2).reshape({batch, length, -1}));
    return x + fc2(torch::gelu(fc1(ln2(x))));
  }
  int64_t head_dim;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  tp::ColumnParallelLinear q{nullptr}, k{nullptr}, v{nullptr}, fc1{nullptr};
  tp::RowParallelLinear projection{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TensorParallelBlock);

struct TensorParallelGptImpl : torch::nn::Module {
  explicit TensorParallelGptImpl(const TensorParallelGptSettings& s) {
    tokens = register_module("tokens", tp::VocabParallelEmbedding(s.vocab, s.d_model));
    positions = register_module("positions", torch::nn::Embedding(s.seq, s.d_model));
    for (int64_t i = 0; i < s.layers; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), TensorParallelBlock(s.d_model, s.heads)));
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})));
    auto head_options = tp::ParallelLinearOptions(s.d_model, s.vocab);
    head_options.bias = false;
    head = register_module("head", tp::ColumnParallelLinear(head_options));
  }
  // ids: [B, L] -> this rank's logits [B, L, vocab/T] (all of them when unsplit).
  at::Tensor forward(const at::Tensor& ids) {
    at::Tensor x = tokens(ids) + positions(torch::arange(ids.size(1), ids.options()));
    for (auto& block : blocks) x = block(x);
    return head(ln_f(x));
  }
  tp::VocabParallelEmbedding tokens{nullptr};
  torch::nn::Embedding positions{nullptr};
  std::vector<TensorParallelBlock> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  tp::ColumnParallelLinear head{nullptr};
};
TORCH_MODULE(TensorParallelGpt);

/// The mean next-token loss: over vocabulary-split logits with the mesh's tensor group, or
/// torch's cross_entropy for the unsplit model (mesh null).
inline at::Tensor tensor_parallel_gpt_loss(const at::Tensor& logits, const at::Tensor& targets,
                                           const lightning::fabric::DeviceMesh* mesh) {
  const at::Tensor rows = logits.flatten(0, 1), wanted = targets.flatten();
  if (mesh == nullptr) return torch::nn::functional::cross_entropy(rows, wanted);
  return tp::vocab_parallel_cross_entropy(rows, wanted, *mesh);
}

/// Step `step`'s global batch of a copy task: [batch, seq] token ids and the next-token targets,
/// drawn from a seed of its own so that every rank and every run draws the same.
inline std::pair<at::Tensor, at::Tensor> tensor_parallel_gpt_batch(const TensorParallelGptSettings& s, int64_t batch,
                                                                   int64_t step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + static_cast<uint64_t>(step));
  const at::Tensor ids = at::randint(s.vocab, {batch, s.seq}, generator, at::TensorOptions().dtype(at::kLong));
  // Each target is a fixed function of the token at its position and of the one before (0 before
  // the first): a pattern the model learns only by attending.
  const at::Tensor before = at::cat({at::zeros({batch, 1}, ids.options()), ids.narrow(1, 0, s.seq - 1)}, 1);
  return {ids, (ids * 7 + before + 3) % s.vocab};
}

}  // namespace examples
