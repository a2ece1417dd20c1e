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
// Sequence parallelism (docs/model-parallel.md, "Sequence parallelism") adds two layers that split
// no weight and run on activations split along the sequence (sequence_dim of the linear layers):
//   ParallelLayerNorm     LayerNorm over the last dimensions; with sequence_parallel, the input is
//                         this rank's sequence slice and the weight and bias gradients are summed
//                         over the tensor group (each rank saw only its slice), so every rank
//                         holds the whole gradient of the replicated weights.
//   ParallelDropout       dropout whose mask is drawn for the whole activation (the input with its
//                         sequence_dim gathered) from the input device's default generator, then
//                         cut to this rank's slice: ranks of a tensor group seeded alike (one seed
//                         per step, say) drop the same elements as the unsplit model would.
//
// Each can be built from an existing torch::nn::Linear / Embedding, whose weights it splits (the
// same full weights on every rank give the same model as the unsplit one). Built without a mesh,
// a layer holds the full weights and computes what the unsplit layer does, with no collective,
// until shard(mesh) splits it in place (its parameters keep their identity, so an optimizer made
// before still holds them; make it before the first step). shard_tensor_parallel_layers shards
// every such layer of a model: the default `parallelize` of the model_parallel strategy.
#pragma once

#include "lightning/fabric/export.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <optional>
#include <vector>

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

/// A parameter that each rank of the tensor group holds 1/T of: rank r holds slice
/// [r n/T, (r+1) n/T) along `dim` of the full tensor (n: its size along dim).
struct SplitParameter {
  at::Tensor tensor;
  int64_t dim = 0;
};

/// What every tensor-parallel layer has: its mesh once sharded, and which parameters are split
/// and along which dimension (clip_gradients counts the others once, not once per rank of the
/// tensor group; checkpoints gather and re-split the split ones). A layer of the user's own
/// derives from it to take part in both.
class LF_API TensorParallelLayer {
 public:
  virtual ~TensorParallelLayer() = default;
  /// Splits the layer over mesh's tensor group, in place (once; ValueError when already split or
  /// when a size does not divide). Not collective.
  virtual void shard(std::shared_ptr<DeviceMesh> mesh) = 0;
  /// The parameters each rank holds a different part of (empty before shard).
  virtual std::vector<SplitParameter> sharded_parameters() const = 0;
  /// Null until shard().
  const std::shared_ptr<DeviceMesh>& mesh() const { return mesh_; }

 protected:
  void set_mesh(std::shared_ptr<DeviceMesh> mesh, const char* layer);
  std::shared_ptr<DeviceMesh> mesh_;
};

/// Shards every TensorParallelLayer in module's tree over mesh (module included).
LF_API void shard_tensor_parallel_layers(torch::nn::Module& module, const std::shared_ptr<DeviceMesh>& mesh);
/// The sharded parameters of every TensorParallelLayer in module's tree.
LF_API std::vector<SplitParameter> sharded_parameters_of(torch::nn::Module& module);

class LF_API ColumnParallelLinearImpl : public torch::nn::Module, public TensorParallelLayer {
 public:
  /// Full weights, initialised as torch::nn::Linear's; split over mesh unless it is null.
  explicit ColumnParallelLinearImpl(ParallelLinearOptions options, std::shared_ptr<DeviceMesh> mesh = nullptr);
  /// This rank's part of full's weight rows and bias (full: [out, in], the same on every rank).
  ColumnParallelLinearImpl(std::shared_ptr<DeviceMesh> mesh, const torch::nn::Linear& full, ParallelLinearOptions options);
  at::Tensor forward(const at::Tensor& input);
  void shard(std::shared_ptr<DeviceMesh> mesh) override;
  std::vector<SplitParameter> sharded_parameters() const override;
  const ParallelLinearOptions& options() const { return options_; }
  at::Tensor weight, bias;  // bias undefined without one

 private:
  ParallelLinearOptions options_;
};
TORCH_MODULE(ColumnParallelLinear);

class LF_API RowParallelLinearImpl : public torch::nn::Module, public TensorParallelLayer {
 public:
  explicit RowParallelLinearImpl(ParallelLinearOptions options, std::shared_ptr<DeviceMesh> mesh = nullptr);
  /// This rank's part of full's weight columns; the whole bias.
  RowParallelLinearImpl(std::shared_ptr<DeviceMesh> mesh, const torch::nn::Linear& full, ParallelLinearOptions options);
  at::Tensor forward(const at::Tensor& input);
  void shard(std::shared_ptr<DeviceMesh> mesh) override;
  std::vector<SplitParameter> sharded_parameters() const override;
  const ParallelLinearOptions& options() const { return options_; }
  at::Tensor weight, bias;

 private:
  ParallelLinearOptions options_;
};
TORCH_MODULE(RowParallelLinear);

class LF_API VocabParallelEmbeddingImpl : public torch::nn::Module, public TensorParallelLayer {
 public:
  /// Full weights, initialised as torch::nn::Embedding's; split over mesh unless it is null.
  VocabParallelEmbeddingImpl(int64_t vocab_size, int64_t embedding_dim, std::shared_ptr<DeviceMesh> mesh = nullptr);
  /// This rank's rows of full's weight.
  VocabParallelEmbeddingImpl(std::shared_ptr<DeviceMesh> mesh, const torch::nn::Embedding& full);
  at::Tensor forward(const at::Tensor& ids);
  void shard(std::shared_ptr<DeviceMesh> mesh) override;
  std::vector<SplitParameter> sharded_parameters() const override;
  /// The first vocabulary id this rank holds; it holds weight.size(0) of them.
  int64_t vocab_start() const { return vocab_start_; }
  at::Tensor weight;

 private:
  int64_t vocab_start_ = 0;
};
TORCH_MODULE(VocabParallelEmbedding);

struct LF_API ParallelLayerNormOptions {
  /// The normalized trailing shape ([d_model] for a transformer).
  ParallelLayerNormOptions(std::vector<int64_t> normalized_shape) : normalized_shape(std::move(normalized_shape)) {}
  std::vector<int64_t> normalized_shape;
  double eps = 1e-5;
  /// The input is this rank's slice of a sequence-split activation (see above). false: the input is
  /// whole on every rank of the tensor group and the layer is torch::nn::LayerNorm.
  bool sequence_parallel = false;
};

/// LayerNorm with elementwise weight (ones) and bias (zeros), named "weight" and "bias" as
/// torch::nn::LayerNorm's, whole on every rank.
class LF_API ParallelLayerNormImpl : public torch::nn::Module, public TensorParallelLayer {
 public:
  explicit ParallelLayerNormImpl(ParallelLayerNormOptions options, std::shared_ptr<DeviceMesh> mesh = nullptr);
  at::Tensor forward(const at::Tensor& input);
  /// Takes the mesh (nothing to split).
  void shard(std::shared_ptr<DeviceMesh> mesh) override;
  std::vector<SplitParameter> sharded_parameters() const override { return {}; }
  const ParallelLayerNormOptions& options() const { return options_; }
  at::Tensor weight, bias;

 private:
  ParallelLayerNormOptions options_;
};
TORCH_MODULE(ParallelLayerNorm);

/// Dropout with probability p; in training, the mask rule above (the input whole when sequence_dim
/// is unset or no mesh splits the layer); identity in eval. ValueError unless 0 <= p < 1.
class LF_API ParallelDropoutImpl : public torch::nn::Module, public TensorParallelLayer {
 public:
  explicit ParallelDropoutImpl(double p, std::optional<int64_t> sequence_dim = std::nullopt,
                               std::shared_ptr<DeviceMesh> mesh = nullptr);
  at::Tensor forward(const at::Tensor& input);
  void shard(std::shared_ptr<DeviceMesh> mesh) override;
  std::vector<SplitParameter> sharded_parameters() const override { return {}; }

 private:
  double p_;
  std::optional<int64_t> sequence_dim_;
};
TORCH_MODULE(ParallelDropout);

}  // namespace lightning::fabric::tensor_parallel
