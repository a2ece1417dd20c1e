// Cross-entropy over vocabulary-split logits, without gathering them (docs/model-parallel.md,
// "The loss"): rank r of the tensor group holds logits[..., r V/T : (r+1) V/T] (a
// ColumnParallelLinear head without gather_output); three all-reduces of one value per row (the
// max, the target's logit, the sum of exponentials) replace an all-gather of [rows, V].
// Collective over the tensor group. Equal to torch's cross_entropy on the gathered logits up to
// rounding; the gradient is softmax - one_hot(target), each rank for its own columns.
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Tensor.h>

#include <string>

namespace lightning::fabric {
class DeviceMesh;
}

namespace lightning::fabric::tensor_parallel {

/// local_logits: [..., V/T] floating; targets: [...] integer ids in [0, V). reduction: "mean"
/// (default, as torch), "sum" or "none" (the per-row losses, shaped like targets). ValueError
/// for another reduction, a shape mismatch or a target outside [0, V).
LF_API at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets,
                                               const DeviceMesh& mesh, const std::string& reduction = "mean");

}  // namespace lightning::fabric::tensor_parallel
