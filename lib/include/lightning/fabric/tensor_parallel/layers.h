// Tensor-parallel layers with Megatron semantics over a DeviceMesh's tensor group
// (docs/model-parallel.md, "Layers"). Each rank holds 1/T of the weights (T = the tensor size);
// forward and backward do the collectives of tensor_parallel/regions.h. Collective over the
// tensor group: every rank of it calls forward (and backward) in the same order. Each layer keeps
// the mesh alive (shared ownership).
//
//   ColumnParallelLinear  weight [out/T, in], bias [out/T]: output features split. Input: full
//                         (or sequence-split with sequence_dim); output: this rank's features, or
//                         all of them with gather_output.
//   RowParallelLinear     weight [out, in/T], bias [out], added once after the reduction. Input:
//                         this rank's features (or full with input_is_parallel = false); output:
//                         full (or sequence-split with sequence_dim).
//   VocabParallelEmbedding weight [vocab/T, dim]: rank r holds rows [r vocab/T, (r+1) vocab/T);
//                         ids outside them give zeros, and the sum over ranks is the embedding.
//
// Each can be built from an existing torch::nn::Linear / Embedding, whose weights it splits (the
// same full weights on every rank give the same model as the unsplit one).
#pragma once

#include "lightning/fabric/export.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <optional>

#include "lightning/fabric/strategies/device_mesh.h"

namespace lightning::fabric::tensor_parallel {

struct LF_API ParallelLinearOptions {
  ParallelLinearOptions(int64_t in_features, int64_t out_features) : in_features(in_features), out_features(out_features) {}
  int64_t in_features;
  int64_t out_features;
  bool bias = true;
  /// Column: all-gather the output features (false: each rank keeps its own, for a following
  /// RowParallelLinear). Unused by RowParallelLinear.
  bool gather_output = false;
  /// Row: the input is already split by features (true: it comes from a ColumnParallelLinear).
  /// Unused by ColumnParallelLinear.
  bool input_is_parallel = true;
  /// Sequence parallelism: the dimension of the sequence, which the activations outside the pair
  /// are split on. Column then all-gathers its input along it (backward: reduce-scatter) and Row
  /// reduce-scatters its output along it (backward: all-gather). Unset: activations are full.
  std::optional<int64_t> sequence_dim;
};

class LF_API ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(std::shared_ptr<DeviceMesh> mesh, ParallelLinearOptions options);
  /// This rank's part of full's weight rows and bias (full: [out, in], the same on every rank).
  ColumnParallelLinearImpl(std::shared_ptr<DeviceMesh> mesh, const torch::nn::Linear& full, ParallelLinearOptions options);
  at::Tensor forward(const at::Tensor& input);
  const ParallelLinearOptions& options() const { return options_; }
  at::Tensor weight, bias;  // bias undefined without one

 private:
  std::shared_ptr<DeviceMesh> mesh_;
  ParallelLinearOptions options_;
};
TORCH_MODULE(ColumnParallelLinear);

class LF_API RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(std::shared_ptr<DeviceMesh> mesh, ParallelLinearOptions options);
  /// This rank's part of full's weight columns; the whole bias.
  RowParallelLinearImpl(std::shared_ptr<DeviceMesh> mesh, const torch::nn::Linear& full, ParallelLinearOptions options);
  at::Tensor forward(const at::Tensor& input);
  const ParallelLinearOptions& options() const { return options_; }
  at::Tensor weight, bias;

 private:
  std::shared_ptr<DeviceMesh> mesh_;
  ParallelLinearOptions options_;
};
TORCH_MODULE(RowParallelLinear);

class LF_API VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(std::shared_ptr<DeviceMesh> mesh, int64_t vocab_size, int64_t embedding_dim);
  /// This rank's rows of full's weight.
  VocabParallelEmbeddingImpl(std::shared_ptr<DeviceMesh> mesh, const torch::nn::Embedding& full);
  at::Tensor forward(const at::Tensor& ids);
  /// The first vocabulary id this rank holds; it holds weight.size(0) of them.
  int64_t vocab_start() const { return vocab_start_; }
  at::Tensor weight;

 private:
  std::shared_ptr<DeviceMesh> mesh_;
  int64_t vocab_start_ = 0;
};
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace lightning::fabric::tensor_parallel
