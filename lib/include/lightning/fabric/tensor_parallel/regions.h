// The autograd regions of Megatron-style tensor parallelism: each moves a tensor across the
// mesh's tensor group in the forward and does the matching collective in the backward
// (docs/model-parallel.md, "Regions"). Collective over the tensor group: every rank of it calls
// the same region, in the same order, with tensors of the same shape. dim may be negative.
//
// | region                         | forward                   | backward                  |
// | copy_to_tensor_region          | identity                  | all-reduce (sum)          |
// | reduce_from_tensor_region      | all-reduce (sum)          | identity                  |
// | gather_from_tensor_region      | all-gather, concat on dim | keep this rank's slice    |
// | scatter_to_tensor_region       | keep this rank's slice    | all-gather, concat on dim |
// | gather_from_sequence_region    | all-gather, concat on dim | reduce-scatter on dim     |
// | reduce_scatter_to_sequence_region | reduce-scatter on dim  | all-gather, concat on dim |
//
// The column- and row-parallel layers are built from these (tensor_parallel/layers.h); sequence
// parallelism is the last two, around code that runs on a sequence slice (LayerNorm, dropout).
// A slice or scatter needs the dimension to divide by the tensor size: ValueError naming both.
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Tensor.h>

namespace lightning::fabric {
class DeviceMesh;
}

namespace lightning::fabric::tensor_parallel {

LF_API at::Tensor copy_to_tensor_region(const at::Tensor& input, const DeviceMesh& mesh);
LF_API at::Tensor reduce_from_tensor_region(const at::Tensor& input, const DeviceMesh& mesh);
LF_API at::Tensor gather_from_tensor_region(const at::Tensor& input, const DeviceMesh& mesh, int64_t dim = -1);
LF_API at::Tensor scatter_to_tensor_region(const at::Tensor& input, const DeviceMesh& mesh, int64_t dim = -1);
LF_API at::Tensor gather_from_sequence_region(const at::Tensor& input, const DeviceMesh& mesh, int64_t dim);
LF_API at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& input, const DeviceMesh& mesh, int64_t dim);

/// This rank's slice of full along dim (no autograd region, no collective): what a rank of the
/// tensor group keeps of a tensor every rank holds. ValueError unless the size divides.
LF_API at::Tensor tensor_slice(const at::Tensor& full, const DeviceMesh& mesh, int64_t dim);

}  // namespace lightning::fabric::tensor_parallel
