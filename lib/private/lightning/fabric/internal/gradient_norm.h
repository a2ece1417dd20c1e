// The total gradient norm and its clipping with multi-tensor (foreach) operations: one
// _foreach_norm and one _foreach_mul_ over all gradients instead of a few operations per
// parameter (Python's clip_grad_norm_ does the same on CUDA). Used by every strategy's
// clip_gradients_by_norm (one implementation, strategy.cpp), which reduces the parts the ranks
// write over the world in between.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

namespace lightning::fabric::internal {

/// The defined, non-empty gradients of parameters.
std::vector<at::Tensor> gradients_of(const std::vector<at::Tensor>& parameters);

/// sum over grads of |g|^p (p = norm_type, finite) or max |g| (p = inf), as a float64 0-d tensor
/// on `device`; zero for no gradients. Raise the sum to 1/p for the norm (total_norm_from).
at::Tensor local_norm_part(const std::vector<at::Tensor>& grads, double norm_type, at::Device device);
/// The norm from a (possibly all-reduced) local_norm_part, still a tensor.
at::Tensor total_norm_from(const at::Tensor& part, double norm_type);

/// Multiplies every gradient in place by min(1, max_norm / (total_norm + 1e-6)), computed on the
/// device: no host synchronisation (the factor 1 leaves a gradient bitwise unchanged).
void scale_to_max_norm(std::vector<at::Tensor>& grads, const at::Tensor& total_norm, double max_norm);

/// What every strategy's clip_gradients_by_norm ends with: the norm from part (this rank's
/// local_norm_part, already reduced over the ranks that share the parameters), a RuntimeError when
/// it is non-finite and error_if_nonfinite, then scale_to_max_norm. Returns the norm (one host
/// read, the return value's).
double clip_to_max_norm(std::vector<at::Tensor>& grads, const at::Tensor& part, double norm_type, double max_norm,
                        bool error_if_nonfinite);

}  // namespace lightning::fabric::internal
