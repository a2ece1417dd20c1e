#include "lightning/fabric/tensor_parallel/layers.h"

#include <ATen/ATen.h>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/tensor_parallel/regions.h"

namespace lightning::fabric::tensor_parallel {
namespace {
void check_divides(const char* layer, const char* what, int64_t size, const DeviceMesh& mesh) {
  LF_CHECK(size % mesh.size("tensor") == 0, ValueError, layer, ": ", what, "=", size, " does not split into ",
           mesh.size("tensor"), " equal parts (the tensor-parallel size). Make it a multiple of ", mesh.size("tensor"),
           " or choose another tensor_parallel_size.");
}

void check_matches(const ParallelLinearOptions& options, const torch::nn::Linear& full, const char* layer) {
  LF_CHECK(full->options.in_features() == options.in_features && full->options.out_features() == options.out_features &&
               full->bias.defined() == options.bias,
           ValueError, layer, ": the options say ", options.in_features, " -> ", options.out_features,
           options.bias ? " with" : " without", " a bias, but the Linear is ", full->options.in_features(), " -> ",
           full->options.out_features(), full->bias.defined() ? " with" : " without", " one.");
}

// In place: the parameter keeps its identity (an optimizer holding it still does) and now holds
// this rank's slice along dim.
void keep_slice(at::Tensor& parameter, const DeviceMesh& mesh, int64_t dim) {
  torch::NoGradGuard no_grad;
  parameter.set_data(tensor_slice(parameter.detach(), mesh, dim).clone());
}

// Registers copies of full's weight and bias (if any) on module.
void copy_linear(torch::nn::Module& module, const torch::nn::Linear& full, at::Tensor& weight, at::Tensor& bias) {
  torch::NoGradGuard no_grad;
  weight = module.register_parameter("weight", full->weight.detach().clone());
  if (full->bias.defined()) bias = module.register_parameter("bias", full->bias.detach().clone());
}

torch::nn::Linear full_linear(const ParallelLinearOptions& options) {
  return torch::nn::Linear(torch::nn::LinearOptions(options.in_features, options.out_features).bias(options.bias));
}
}  // namespace

void TensorParallelLayer::set_mesh(std::shared_ptr<DeviceMesh> mesh, const char* layer) {
  LF_CHECK(mesh != nullptr, ValueError, layer, ".shard: the mesh is null; pass the DeviceMesh to split over.");
  LF_CHECK(mesh_ == nullptr, ValueError, layer, ".shard: the layer is already split over a mesh; shard it once.");
  mesh_ = std::move(mesh);
}

void shard_tensor_parallel_layers(torch::nn::Module& module, const std::shared_ptr<DeviceMesh>& mesh) {
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (auto* layer = dynamic_cast<TensorParallelLayer*>(child.get())) layer->shard(mesh);
  }
}

std::vector<SplitParameter> sharded_parameters_of(torch::nn::Module& module) {
  std::vector<SplitParameter> sharded;
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (auto* layer = dynamic_cast<TensorParallelLayer*>(child.get())) {
      for (auto& parameter : layer->sharded_parameters()) sharded.push_back(parameter);
    }
  }
  return sharded;
}

// ---- ColumnParallelLinear ----

ColumnParallelLinearImpl::ColumnParallelLinearImpl(ParallelLinearOptions options, std::shared_ptr<DeviceMesh> mesh)
    : options_(std::move(options)) {
  copy_linear(*this, full_linear(options_), weight, bias);
  if (mesh) shard(std::move(mesh));
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(std::shared_ptr<DeviceMesh> mesh, const torch::nn::Linear& full,
                                                   ParallelLinearOptions options)
    : options_(std::move(options)) {
  check_matches(options_, full, "ColumnParallelLinear");
  copy_linear(*this, full, weight, bias);
  shard(std::move(mesh));
}

void ColumnParallelLinearImpl::shard(std::shared_ptr<DeviceMesh> mesh) {
  LF_CHECK(mesh != nullptr, ValueError, "ColumnParallelLinear.shard: the mesh is null; pass the DeviceMesh to split over.");
  check_divides("ColumnParallelLinear", "out_features", options_.out_features, *mesh);
  set_mesh(mesh, "ColumnParallelLinear");
  keep_slice(weight, *mesh_, 0);
  if (bias.defined()) keep_slice(bias, *mesh_, 0);
}

std::vector<SplitParameter> ColumnParallelLinearImpl::sharded_parameters() const {
  if (!mesh_) return {};
  std::vector<SplitParameter> split{{weight, 0}};
  if (bias.defined()) split.push_back({bias, 0});
  return split;
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& input) {
  if (!mesh_) return at::linear(input, weight, bias);
  const at::Tensor full_input = options_.sequence_dim ? gather_from_sequence_region(input, *mesh_, *options_.sequence_dim)
                                                      : copy_to_tensor_region(input, *mesh_);
  const at::Tensor output = at::linear(full_input, weight, bias);
  return options_.gather_output ? gather_from_tensor_region(output, *mesh_, -1) : output;
}

// ---- RowParallelLinear ----

RowParallelLinearImpl::RowParallelLinearImpl(ParallelLinearOptions options, std::shared_ptr<DeviceMesh> mesh)
    : options_(std::move(options)) {
  copy_linear(*this, full_linear(options_), weight, bias);
  if (mesh) shard(std::move(mesh));
}

RowParallelLinearImpl::RowParallelLinearImpl(std::shared_ptr<DeviceMesh> mesh, const torch::nn::Linear& full,
                                             ParallelLinearOptions options)
    : options_(std::move(options)) {
  check_matches(options_, full, "RowParallelLinear");
  copy_linear(*this, full, weight, bias);
  shard(std::move(mesh));
}

void RowParallelLinearImpl::shard(std::shared_ptr<DeviceMesh> mesh) {
  LF_CHECK(mesh != nullptr, ValueError, "RowParallelLinear.shard: the mesh is null; pass the DeviceMesh to split over.");
  check_divides("RowParallelLinear", "in_features", options_.in_features, *mesh);
  set_mesh(mesh, "RowParallelLinear");
  keep_slice(weight, *mesh_, 1);  // the bias stays whole: it is added once, after the reduction
}

std::vector<SplitParameter> RowParallelLinearImpl::sharded_parameters() const {
  if (!mesh_) return {};
  return {{weight, 1}};
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  if (!mesh_) return at::linear(input, weight, bias);
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

// ---- VocabParallelEmbedding ----

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab_size, int64_t embedding_dim,
                                                       std::shared_ptr<DeviceMesh> mesh) {
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", torch::nn::Embedding(vocab_size, embedding_dim)->weight.detach().clone());
  if (mesh) shard(std::move(mesh));
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(std::shared_ptr<DeviceMesh> mesh, const torch::nn::Embedding& full) {
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", full->weight.detach().clone());
  shard(std::move(mesh));
}

void VocabParallelEmbeddingImpl::shard(std::shared_ptr<DeviceMesh> mesh) {
  LF_CHECK(mesh != nullptr, ValueError, "VocabParallelEmbedding.shard: the mesh is null; pass the DeviceMesh to split over.");
  const int64_t vocab = weight.size(0);
  check_divides("VocabParallelEmbedding", "num_embeddings", vocab, *mesh);
  set_mesh(mesh, "VocabParallelEmbedding");
  vocab_start_ = vocab / mesh_->size("tensor") * mesh_->coordinate("tensor");
  keep_slice(weight, *mesh_, 0);
}

std::vector<SplitParameter> VocabParallelEmbeddingImpl::sharded_parameters() const {
  if (!mesh_) return {};
  return {{weight, 0}};
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  if (!mesh_) return at::embedding(weight, ids);
  const int64_t rows = weight.size(0);
  const at::Tensor outside = (ids < vocab_start_).logical_or(ids >= vocab_start_ + rows);
  const at::Tensor local_ids = (ids - vocab_start_).masked_fill(outside, 0);
  const at::Tensor embedded = at::embedding(weight, local_ids).masked_fill(outside.unsqueeze(-1), 0);
  return reduce_from_tensor_region(embedded, *mesh_);
}

// ---- ParallelLayerNorm ----

ParallelLayerNormImpl::ParallelLayerNormImpl(ParallelLayerNormOptions options, std::shared_ptr<DeviceMesh> mesh)
    : options_(std::move(options)) {
  weight = register_parameter("weight", at::ones(options_.normalized_shape));
  bias = register_parameter("bias", at::zeros(options_.normalized_shape));
  if (mesh) shard(std::move(mesh));
}

void ParallelLayerNormImpl::shard(std::shared_ptr<DeviceMesh> mesh) { set_mesh(std::move(mesh), "ParallelLayerNorm"); }

at::Tensor ParallelLayerNormImpl::forward(const at::Tensor& input) {
  // Each rank normalises its own sequence slice: its weight gradient is a part, summed over the
  // tensor group in backward.
  const bool summed = mesh_ != nullptr && options_.sequence_parallel;
  return at::layer_norm(input, options_.normalized_shape, summed ? copy_to_tensor_region(weight, *mesh_) : weight,
                        summed ? copy_to_tensor_region(bias, *mesh_) : bias, options_.eps);
}

// ---- ParallelDropout ----

ParallelDropoutImpl::ParallelDropoutImpl(double p, std::optional<int64_t> sequence_dim, std::shared_ptr<DeviceMesh> mesh)
    : p_(p), sequence_dim_(sequence_dim) {
  LF_CHECK(p >= 0 && p < 1, ValueError, "ParallelDropout: p=", p, " is not a dropout probability; choose 0 <= p < 1.");
  if (mesh) shard(std::move(mesh));
}

void ParallelDropoutImpl::shard(std::shared_ptr<DeviceMesh> mesh) { set_mesh(std::move(mesh), "ParallelDropout"); }

at::Tensor ParallelDropoutImpl::forward(const at::Tensor& input) {
  if (!is_training() || p_ == 0) return input;
  const bool split = mesh_ != nullptr && sequence_dim_ && mesh_->size("tensor") > 1;
  std::vector<int64_t> whole = input.sizes().vec();
  const int64_t dim = split ? at::maybe_wrap_dim(*sequence_dim_, input.dim()) : 0;
  if (split) whole[static_cast<size_t>(dim)] *= mesh_->size("tensor");
  at::Tensor keep = at::empty(whole, input.options()).bernoulli_(1 - p_);
  if (split) keep = tensor_slice(keep, *mesh_, dim);
  return input * keep / (1 - p_);
}

}  // namespace lightning::fabric::tensor_parallel
