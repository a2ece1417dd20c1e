// A GPT-style language model as consecutive layers for lf::Pipeline (docs/pipeline-parallel.md):
// token and position embedding, pre-norm transformer blocks (causal self-attention, MLP), and a
// final LayerNorm with the vocabulary head. Each layer takes the previous one's output tensor, so
// the pipeline strategy can cut the model between any two of them. With tensor_parallel set, the
// blocks are examples/common/tensor_parallel_gpt.h's and the head is column-parallel (logits split
// by vocabulary), so the pipeline strategy's tensor_parallel_size splits them inside each stage.
// Used by the pipeline tests.
#pragma once

#include <lightning/fabric.h>
#include <torch/torch.h>

#include <cmath>
#include <utility>

#include "tensor_parallel_gpt.h"

namespace examples {

struct PipelineGptSettings {
  int64_t vocab = 256, seq = 32, d_model = 64, heads = 4, blocks = 6;
  bool tensor_parallel = false;
};

struct GptEmbeddingImpl : torch::nn::Module {
  explicit GptEmbeddingImpl(const PipelineGptSettings& s)
      : tokens(register_module("tokens", torch::nn::Embedding(s.vocab, s.d_model))),
        positions(register_module("positions", torch::nn::Embedding(s.seq, s.d_model))) {}
  torch::Tensor forward(const torch::Tensor& ids) {  // [B, L] int64 -> [B, L, D]
    return tokens(ids) + positions(torch::arange(ids.size(1), ids.options()));
  }
  torch::nn::Embedding tokens, positions;
};
TORCH_MODULE(GptEmbedding);

struct GptBlockImpl : torch::nn::Module {
  explicit GptBlockImpl(const PipelineGptSettings& s)
      : heads(s.heads),
        norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})))),
        qkv(register_module("qkv", torch::nn::Linear(s.d_model, 3 * s.d_model))),
        out(register_module("out", torch::nn::Linear(s.d_model, s.d_model))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})))),
        up(register_module("up", torch::nn::Linear(s.d_model, 4 * s.d_model))),
        down(register_module("down", torch::nn::Linear(4 * s.d_model, s.d_model))) {}
  torch::Tensor forward(const torch::Tensor& x) {  // [B, L, D] -> [B, L, D]
    const int64_t B = x.size(0), L = x.size(1), D = x.size(2), h = heads, hd = D / h;
    auto parts = qkv(norm1(x)).view({B, L, 3, h, hd}).permute({2, 0, 3, 1, 4});  // [3, B, h, L, hd]
    auto scores = torch::matmul(parts[0], parts[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    auto causal = torch::ones({L, L}, x.options().dtype(torch::kBool)).triu(1);
    auto attention = torch::matmul(scores.masked_fill(causal, -1e9).softmax(-1), parts[2]);
    auto y = x + out(attention.transpose(1, 2).reshape({B, L, D}));
    return y + down(torch::gelu(up(norm2(y))));
  }
  int64_t heads;
  torch::nn::LayerNorm norm1;
  torch::nn::Linear qkv, out;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear up, down;
};
TORCH_MODULE(GptBlock);

struct GptHeadImpl : torch::nn::Module {
  explicit GptHeadImpl(const PipelineGptSettings& s)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})))),
        proj(register_module("proj", torch::nn::Linear(s.d_model, s.vocab))) {}
  torch::Tensor forward(const torch::Tensor& x) { return proj(norm(x)); }  // [B, L, D] -> [B, L, V]
  torch::nn::LayerNorm norm;
  torch::nn::Linear proj;
};
TORCH_MODULE(GptHead);

/// The tensor-parallel head: the final norm, then the vocabulary split across the tensor group.
struct GptParallelHeadImpl : torch::nn::Module {
  explicit GptParallelHeadImpl(const PipelineGptSettings& s)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})))),
        proj(register_module("proj", tp::ColumnParallelLinear(tp::ParallelLinearOptions(s.d_model, s.vocab)))) {}
  torch::Tensor forward(const torch::Tensor& x) { return proj(norm(x)); }  // [B, L, D] -> [B, L, V/T]
  torch::nn::LayerNorm norm;
  tp::ColumnParallelLinear proj;
};
TORCH_MODULE(GptParallelHead);

/// The layers in order: embedding, `blocks` blocks, head.
inline torch::nn::Sequential pipeline_gpt_layers(const PipelineGptSettings& s) {
  torch::nn::Sequential layers{GptEmbedding(s)};
  TensorParallelGptSettings parallel{s.vocab, s.seq, s.d_model, s.heads, s.blocks};
  for (int64_t b = 0; b < s.blocks; ++b) {
    if (s.tensor_parallel) layers->push_back(TensorParallelBlock(parallel));
    else layers->push_back(GptBlock(s));
  }
  if (s.tensor_parallel) layers->push_back(GptParallelHead(s));
  else layers->push_back(GptHead(s));
  return layers;
}

/// Next-token cross entropy, mean over every position: over vocabulary-split logits with the
/// mesh's tensor group, or torch's cross_entropy when mesh is null (whole logits).
inline torch::Tensor pipeline_gpt_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                                       const lightning::fabric::DeviceMesh* mesh = nullptr) {
  return tensor_parallel_gpt_loss(logits, targets, mesh);
}

/// Batch `step` of a fixed synthetic corpus: each row counts up from a seeded start (mod vocab),
/// so the next token is learnable. (ids, targets), both [batch, seq] int64.
inline std::pair<torch::Tensor, torch::Tensor> pipeline_gpt_batch(const PipelineGptSettings& s, int64_t batch,
                                                                  int64_t step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + static_cast<uint64_t>(step));
  auto starts = torch::randint(s.vocab, {batch, 1}, generator, torch::kLong);
  auto sequence = (starts + torch::arange(s.seq + 1, torch::kLong)).remainder(s.vocab);
  return {sequence.narrow(1, 0, s.seq).contiguous(), sequence.narrow(1, 1, s.seq).contiguous()};
}

}  // namespace examples
