// Context parallelism in a model's code (docs/model-parallel.md, "Context parallelism"). Within
// a Region, attention() is ring attention over the mesh's "context" group (ring_attention.h) and
// positions() are the global positions of this rank's part of the sequence; outside one, or on a
// mesh without a "context" dimension, they are plain scaled-dot-product attention and
// 0..length-1, so one model runs under every strategy. As PyTorch's context_parallel(mesh,
// buffers=..., buffer_seq_dims=...), but the batch is cut by Region::shard, not in place.
//   const lf::DeviceMesh* mesh = fabric.strategy_as<lf::MeshStrategy>().device_mesh().get();
//   lf::context_parallel::Region region(mesh);          // load-balanced split (causal masks)
//   at::Tensor ids = region.shard(batch_ids, 1), targets = region.shard(batch_targets, 1);
//   at::Tensor loss = loss_of(model(ids), targets);      // the model calls attention(), positions()
//   fabric.backward(loss);                               // the region may end before the backward
// (a checkpointed module's recompute runs in the region of its forward: activation_checkpoint.h).
// Each context rank's loss is the mean over its part; the strategy averages gradients over data x
// context, so the step is the whole sequence's.
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace lightning::fabric {
class DeviceMesh;
}

namespace lightning::fabric::context_parallel {

/// Makes the sequence split over mesh's "context" group current on this thread for its lifetime
/// (regions nest; the innermost is current). The mesh must outlive the region and the backward.
class LF_API Region {
 public:
  /// mesh null, or without a "context" dimension: one rank holds the whole sequence.
  /// load_balance: each rank holds chunks r and 2n-1-r of 2n (the layout for causal masks, as
  /// PyTorch's default); false: the r-th of n contiguous chunks.
  explicit Region(const DeviceMesh* mesh, bool load_balance = true);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  /// This rank's part of full along dim (shard_sequence); full itself with one context rank.
  at::Tensor shard(const at::Tensor& full, int64_t dim) const;
  /// Every rank's part put back in sequence order (unshard_sequence; collective).
  at::Tensor unshard(const at::Tensor& local, int64_t dim) const;
  /// The context group's size (1 without one) and this rank's place in it.
  int size() const { return size_; }
  int rank() const { return rank_; }
  const DeviceMesh* mesh() const { return mesh_; }
  bool load_balance() const { return load_balance_; }
  /// The region current on this thread, or null.
  static const Region* current();

 private:
  const DeviceMesh* mesh_;
  bool load_balance_;
  int size_ = 1, rank_ = 0;
  const Region* enclosing_;
};

/// softmax(q k^T / sqrt(head_dim) [+ causal mask]) v with q, k, v [batch, heads, local_seq,
/// head_dim]: ring_attention over the current region's context group when it has more than one
/// rank (float32 or float64), at::scaled_dot_product_attention otherwise. Differentiable.
LF_API at::Tensor attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, bool causal);

/// The global positions of this rank's local_length tokens ([local_length], int64): 0..length-1
/// without a region of more than one rank.
LF_API at::Tensor positions(int64_t local_length, c10::Device device = c10::kCPU);

}  // namespace lightning::fabric::context_parallel
