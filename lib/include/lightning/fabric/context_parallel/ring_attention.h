// Context parallelism: the sequence split over the mesh's "context" group, attention by a ring.
// Contract (as PyTorch's context_parallel behaves):
// - Layout. n = mesh.size("context"), r = mesh.coordinate("context"). Plain split: rank r holds
//   the r-th of n equal contiguous chunks. Load-balanced split (for causal masks): the sequence is
//   cut into 2n equal chunks and rank r holds chunks r and 2n-1-r, concatenated in that order, so
//   every rank has the same share of the causal mask's work.
// - ring_attention: softmax(q k^T / sqrt(head_dim) [+ causal mask]) v for this rank's queries
//   against the whole sequence. Keys and values travel n-1 steps around the ring (to r+1, from
//   r-1); each step's partial result merges with the running one by its log-sum-exp (online
//   softmax), so no rank holds the whole sequence. The causal mask uses global positions from the
//   split named by load_balance; blocks the mask hides entirely are not computed.
// - Backward: dQ stays here; dK and dV partial sums travel around the ring with their keys and
//   values and reach their owner after n steps.
// - Collective over the context group: every rank of it calls the same functions in the same
//   order, backward included, with tensors of the same shapes; the mesh must outlive the backward.
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace lightning::fabric {
class DeviceMesh;
}

namespace lightning::fabric::context_parallel {

/// This rank's part of full along dim (negative allowed) in the layout above. No collective;
/// differentiable (a slice, or two concatenated). ValueError naming the length, the chunk count
/// and the context size unless the length splits into n (plain) or 2n (load_balance) equal chunks.
LF_API at::Tensor shard_sequence(const at::Tensor& full, int64_t dim, const DeviceMesh& mesh, bool load_balance);

/// The inverse of shard_sequence: every rank's part gathered over the context group (collective)
/// and put back in sequence order. Every rank passes a part of the same shape. Not differentiable.
LF_API at::Tensor unshard_sequence(const at::Tensor& local, int64_t dim, const DeviceMesh& mesh, bool load_balance);

/// Scaled dot-product attention (scale 1/sqrt(head_dim)) of this rank's queries against every
/// rank's keys and values. query, key, value: [batch, heads, local_seq, head_dim] (value's
/// head_dim may differ), one float dtype (float32 or float64), one device; with causal, key's
/// local_seq equals query's, and with load_balance too it is even. Returns [batch, heads,
/// local_seq, value head_dim], this rank's rows. Differentiable in all three inputs.
/// ValueError naming the shapes or dtypes otherwise (and, collectively, when ranks' keys or
/// values differ in shape).
LF_API at::Tensor ring_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                 const DeviceMesh& mesh, bool causal, bool load_balance);

}  // namespace lightning::fabric::context_parallel
