#include "lightning/fabric/tensor_parallel/layers.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <cmath>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/tensor_parallel/regions.h"

namespace lightning::fabric::tensor_parallel {
namespace {
std::shared_ptr<DeviceMesh> checked(std::shared_ptr<DeviceMesh> mesh, const char* layer) {
  LF_CHECK(mesh != nullptr, ValueError, layer, ": the mesh is null; pass the DeviceMesh the layer splits over.");
  return mesh;
}

void check_divides(const char* layer, const char* what, int64_t size, const DeviceMesh& mesh) {
  LF_CHECK(size % mesh.tensor_size() == 0, ValueError, layer, ": ", what, "=", size, " does not split into ",
           mesh.tensor_size(), " equal parts (the tensor-parallel size). Make it a multiple of ", mesh.tensor_size(),
           " or choose another tensor_parallel_size.");
}

// A full Linear's weights as torch::nn::Linear initialises them, made alike on every rank (the
// same seed), so that a split layer equals the unsplit one. Transient: one full layer at a time.
torch::nn::Linear full_linear(const ParallelLinearOptions& options) {
  return torch::nn::Linear(torch::nn::LinearOptions(options.in_features, options.out_features).bias(options.bias));
}

const ParallelLinearOptions& matching(const ParallelLinearOptions& options, const torch::nn::Linear& full, const char* layer) {
  LF_CHECK(full->options.in_features() == options.in_features && full->options.out_features() == options.out_features &&
               full->bias.defined() == options.bias,
           ValueError, layer, ": the options say ", options.in_features, " -> ", options.out_features,
           options.bias ? " with" : " without", " a bias, but the Linear is ", full->options.in_features(), " -> ",
           full->options.out_features(), full->bias.defined() ? " with" : " without", " one.");
  return options;
}
}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(std::shared_ptr<DeviceMesh> mesh, ParallelLinearOptions options)
    : ColumnParallelLinearImpl(std::move(mesh), full_linear(options), options) {}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(std::shared_ptr<DeviceMesh> mesh, const torch::nn::Linear& full,
                                                   ParallelLinearOptions options)
    : mesh_(checked(std::move(mesh), "ColumnParallelLinear")),
      options_(matching(options, full, "ColumnParallelLinear")) {
  check_divides("ColumnParallelLinear", "out_features", options_.out_features, *mesh_);
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", tensor_slice(full->weight.detach(), *mesh_, 0).clone());
  if (options_.bias) bias = register_parameter("bias", tensor_slice(full->bias.detach(), *mesh_, 0).clone());
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& input) {
  const at::Tensor full_input = options_.sequence_dim ? gather_from_sequence_region(input, *mesh_, *options_.sequence_dim)
                                                      : copy_to_tensor_region(input, *mesh_);
  const at::Tensor output = at::linear(full_input, weight, bias);
  return options_.gather_output ? gather_from_tensor_region(output, *mesh_, -1) : output;
}

RowParallelLinearImpl::RowParallelLinearImpl(std::shared_ptr<DeviceMesh> mesh, ParallelLinearOptions options)
    : RowParallelLinearImpl(std::move(mesh), full_linear(options), options) {}

RowParallelLinearImpl::RowParallelLinearImpl(std::shared_ptr<DeviceMesh> mesh, const torch::nn::Linear& full,
                                             ParallelLinearOptions options)
    : mesh_(checked(std::move(mesh), "RowParallelLinear")), options_(matching(options, full, "RowParallelLinear")) {
  check_divides("RowParallelLinear", "in_features", options_.in_features, *mesh_);
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", tensor_slice(full->weight.detach(), *mesh_, 1).clone());
  if (options_.bias) bias = register_parameter("bias", full->bias.detach().clone());
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  const at::Tensor local_input = options_.input_is_parallel ? input : scatter_to_tensor_region(input, *mesh_, -1);
  const at::Tensor partial = at::linear(local_input, weight);
  if (!options_.sequence_dim) {
    const at::Tensor output = reduce_from_tensor_region(partial, *mesh_);
    return bias.defined() ? output + bias : output;
  }
  // Each rank adds the bias to its own sequence slice, so its gradient is a part: the copy
  // region sums the parts over the tensor group in the backward.
  const at::Tensor output = reduce_scatter_to_sequence_region(partial, *mesh_, *options_.sequence_dim);
  return bias.defined() ? output + copy_to_tensor_region(bias, *mesh_) : output;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(std::shared_ptr<DeviceMesh> mesh, int64_t vocab_size,
                                                       int64_t embedding_dim)
    : VocabParallelEmbeddingImpl(std::move(mesh), torch::nn::Embedding(vocab_size, embedding_dim)) {}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(std::shared_ptr<DeviceMesh> mesh, const torch::nn::Embedding& full)
    : mesh_(checked(std::move(mesh), "VocabParallelEmbedding")) {
  const int64_t vocab = full->weight.size(0);
  check_divides("VocabParallelEmbedding", "num_embeddings", vocab, *mesh_);
  vocab_start_ = vocab / mesh_->tensor_size() * mesh_->tensor_rank();
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", tensor_slice(full->weight.detach(), *mesh_, 0).clone());
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  const int64_t rows = weight.size(0);
  const at::Tensor outside = (ids < vocab_start_).logical_or(ids >= vocab_start_ + rows);
  const at::Tensor local_ids = (ids - vocab_start_).masked_fill(outside, 0);
  const at::Tensor embedded = at::embedding(weight, local_ids).masked_fill(outside.unsqueeze(-1), 0);
  return reduce_from_tensor_region(embedded, *mesh_);
}

}  // namespace lightning::fabric::tensor_parallel
