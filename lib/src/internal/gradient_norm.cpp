#include "lightning/fabric/internal/gradient_norm.h"

#include <ATen/ATen.h>

#include <cmath>

#include "lightning/fabric/errors.h"

namespace lightning::fabric::internal {

std::vector<at::Tensor> gradients_of(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  grads.reserve(parameters.size());
  for (const auto& parameter : parameters) {
    const at::Tensor& grad = parameter.grad();
    if (grad.defined() && grad.numel() > 0) grads.push_back(grad);
  }
  return grads;
}

at::Tensor local_norm_part(const std::vector<at::Tensor>& grads, double norm_type, at::Device device) {
  const auto float64 = at::TensorOptions().dtype(at::kDouble).device(device);
  if (grads.empty()) return at::zeros({}, float64);
  std::vector<at::Tensor> norms = at::_foreach_norm(grads, norm_type);
  for (auto& norm : norms) {
    if (norm.device() != device) norm = norm.to(device);
  }
  const at::Tensor stacked = at::stack(norms).to(at::kDouble);
  return std::isinf(norm_type) ? stacked.max() : stacked.pow(norm_type).sum();
}

at::Tensor total_norm_from(const at::Tensor& part, double norm_type) {
  return std::isinf(norm_type) ? part : part.pow(1.0 / norm_type);
}

void scale_to_max_norm(std::vector<at::Tensor>& grads, const at::Tensor& total_norm, double max_norm) {
  if (grads.empty()) return;
  const at::Tensor factor = (max_norm / (total_norm + 1e-6)).clamp_max(1.0);
  // One factor per device (and dtype), as _foreach_mul_ with a tensor wants it.
  std::vector<at::Tensor> group;
  for (size_t i = 0; i < grads.size(); ++i) {
    group.push_back(grads[i]);
    const bool last = i + 1 == grads.size();
    if (!last && grads[i + 1].device() == grads[i].device() && grads[i + 1].scalar_type() == grads[i].scalar_type()) {
      continue;
    }
    at::_foreach_mul_(group, factor.to(grads[i].device(), grads[i].scalar_type()));
    group.clear();
  }
}

double clip_to_max_norm(std::vector<at::Tensor>& grads, const at::Tensor& part, double norm_type, double max_norm,
                        bool error_if_nonfinite) {
  const at::Tensor total = total_norm_from(part, norm_type);
  const double value = total.item<double>();
  LF_CHECK(!error_if_nonfinite || std::isfinite(value), RuntimeError, "clip_gradients: the total norm of order ",
           norm_type, " of the gradients is non-finite (", value, "). Pass nonfinite_is_error(false) to clip anyway.");
  scale_to_max_norm(grads, total, max_norm);
  return value;
}

}  // namespace lightning::fabric::internal
