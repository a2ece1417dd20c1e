// A GPT-style language model built from tensor-parallel layers (docs/model-parallel.md): token
// embedding split by vocabulary, pre-norm blocks whose attention has q, k and v column-parallel
// (each rank of the tensor group computes its own heads) and the output projection row-parallel,
// an MLP column- then row-parallel, and a column-parallel head whose logits stay split by
// vocabulary for tp::vocab_parallel_cross_entropy; optionally sequence parallel, with residual
// dropout; context parallel inside a lf::context_parallel::Region (ring attention, global
// positions). Until a mesh splits its layers (the
// model_parallel strategy's setup) it is the ordinary unsplit model, so the same code trains
// under every strategy. Used by examples/tensor_parallel_gpt and the model_parallel tests.
#pragma once

#include <lightning/fabric.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace examples {

namespace tp = lightning::fabric::tensor_parallel;
namespace cp = lightning::fabric::context_parallel;

struct TensorParallelGptSettings {
  int64_t vocab = 256, seq = 32, d_model = 64, heads = 4, layers = 2;
  /// Sequence parallelism: between the tensor-parallel pairs (LayerNorm, dropout, the residual
  /// stream) each rank of the tensor group holds its slice of the sequence, not all of it.
  bool sequence_parallel = false;
  /// Residual dropout after the attention and the MLP (tp::ParallelDropout's mask rule).
  double dropout = 0.0;
};

struct TensorParallelBlockImpl : torch::nn::Module {
  explicit TensorParallelBlockImpl(const TensorParallelGptSettings& s) : head_dim(s.d_model / s.heads) {
    const int64_t d = s.d_model;
    // Under sequence parallelism the column layers gather the sequence and the row layers scatter
    // it again, along dimension 1 of [B, L, D].
    const std::optional<int64_t> sequence_dim = s.sequence_parallel ? std::optional<int64_t>(1) : std::nullopt;
    auto linear = [&](int64_t in, int64_t out) {
      auto options = tp::ParallelLinearOptions(in, out);
      options.sequence_dim = sequence_dim;
      return options;
    };
    auto norm = [&] {
      tp::ParallelLayerNormOptions options({d});
      options.sequence_parallel = s.sequence_parallel;
      return tp::ParallelLayerNorm(options);
    };
    ln1 = register_module("ln1", norm());
    q = register_module("q", tp::ColumnParallelLinear(linear(d, d)));
    k = register_module("k", tp::ColumnParallelLinear(linear(d, d)));
    v = register_module("v", tp::ColumnParallelLinear(linear(d, d)));
    projection = register_module("projection", tp::RowParallelLinear(linear(d, d)));
    drop1 = register_module("drop1", tp::ParallelDropout(s.dropout, sequence_dim));
    ln2 = register_module("ln2", norm());
    fc1 = register_module("fc1", tp::ColumnParallelLinear(linear(d, 4 * d)));
    fc2 = register_module("fc2", tp::RowParallelLinear(linear(4 * d, d)));
    drop2 = register_module("drop2", tp::ParallelDropout(s.dropout, sequence_dim));
  }
  // x: [B, L, D], full on every rank of the tensor group (or [B, L/T, D], this rank's sequence
  // slice, under sequence parallelism).
  at::Tensor forward(at::Tensor x) {
    const at::Tensor h = ln1(x);
    const at::Tensor queries = q(h);  // [B, L, D/T]: the whole sequence, this rank's heads
    const int64_t batch = queries.size(0), length = queries.size(1);
    // This rank's heads: [B, heads/T, L, head_dim]. Inside a context-parallel region L is this
    // rank's part of the sequence and attention runs around the context group's ring.
    auto heads_of = [&](const at::Tensor& t) { return t.view({batch, length, -1, head_dim}).transpose(1, 2); };
    const at::Tensor attended = cp::attention(heads_of(queries), heads_of(k(h)), heads_of(v(h)), /*causal=*/true);
    x = x + drop1(projection(attended.transpose(1, 2).reshape({batch, length, -1})));
    return x + drop2(fc2(torch::gelu(fc1(ln2(x)))));
  }
  int64_t head_dim;
  tp::ParallelLayerNorm ln1{nullptr}, ln2{nullptr};
  tp::ColumnParallelLinear q{nullptr}, k{nullptr}, v{nullptr}, fc1{nullptr};
  tp::RowParallelLinear projection{nullptr}, fc2{nullptr};
  tp::ParallelDropout drop1{nullptr}, drop2{nullptr};
};
TORCH_MODULE(TensorParallelBlock);

struct TensorParallelGptImpl : torch::nn::Module {
  explicit TensorParallelGptImpl(const TensorParallelGptSettings& s) : sequence_parallel(s.sequence_parallel) {
    tokens = register_module("tokens", tp::VocabParallelEmbedding(s.vocab, s.d_model));
    positions = register_module("positions", torch::nn::Embedding(s.seq, s.d_model));
    for (int64_t i = 0; i < s.layers; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), TensorParallelBlock(s)));
    }
    tp::ParallelLayerNormOptions norm({s.d_model});
    norm.sequence_parallel = s.sequence_parallel;
    ln_f = register_module("ln_f", tp::ParallelLayerNorm(norm));
    auto head_options = tp::ParallelLinearOptions(s.d_model, s.vocab);
    head_options.bias = false;
    if (s.sequence_parallel) head_options.sequence_dim = 1;
    head = register_module("head", tp::ColumnParallelLinear(head_options));
  }
  // ids: [B, L] -> this rank's logits [B, L, vocab/T] (all of them when unsplit).
  at::Tensor forward(const at::Tensor& ids) {
    at::Tensor x = tokens(ids) + positions(cp::positions(ids.size(1), ids.device()));  // global positions
    // Sequence parallelism: from here to the head, this rank's slice of the sequence.
    if (sequence_parallel && tokens->mesh()) x = tp::scatter_to_tensor_region(x, *tokens->mesh(), 1);
    for (auto& block : blocks) x = lightning::fabric::call(block, x);  // recomputed when its activations are checkpointed
    return head(ln_f(x));
  }
  bool sequence_parallel;
  tp::VocabParallelEmbedding tokens{nullptr};
  torch::nn::Embedding positions{nullptr};
  std::vector<TensorParallelBlock> blocks;
  tp::ParallelLayerNorm ln_f{nullptr};
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
