#include "lightning/fabric/checkpoint/placement.h"

#include <ATen/ATen.h>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

Placement Placement::whole(const std::vector<int64_t>& shape) {
  return Placement{shape, dcp::Box{std::vector<int64_t>(shape.size(), 0), shape}, std::nullopt, true};
}

std::vector<int64_t> Placement::local_shape() const { return flat ? std::vector<int64_t>{flat->length} : box.sizes; }

std::vector<dcp::Box> Placement::boxes() const {
  if (!flat) return box.numel() == 0 ? std::vector<dcp::Box>{} : std::vector<dcp::Box>{box};
  std::vector<dcp::Box> out = dcp::flat_range_boxes(box.sizes, flat->begin, flat->length);
  for (dcp::Box& part : out) {
    for (size_t d = 0; d < part.offsets.size(); ++d) part.offsets[d] += box.offsets[d];
  }
  return out;
}

namespace {
at::Tensor box_of(at::Tensor tensor, const dcp::Box& box) {
  for (size_t d = 0; d < box.sizes.size(); ++d) tensor = tensor.narrow(static_cast<int64_t>(d), box.offsets[d], box.sizes[d]);
  return tensor;
}
}  // namespace

void check_global_shape(c10::IntArrayRef saved, const Placement& placement, const std::string& what) {
  LF_CHECK(saved == c10::IntArrayRef(placement.global_shape), RuntimeError, "fabric.load: '", what, "' has shape ", saved,
           " in the checkpoint, but this model's tensor is ", c10::IntArrayRef(placement.global_shape),
           " whole (this rank holds ", c10::IntArrayRef(placement.local_shape()), " of it). The checkpoint comes from "
           "another model: load it into the model it was saved from.");
}

at::Tensor part_of_whole(const at::Tensor& whole, const Placement& placement, const std::string& what) {
  check_global_shape(whole.sizes(), placement, what);
  const at::Tensor box = box_of(whole, placement.box);
  if (!placement.flat) return box.clone();
  return box.reshape(-1).narrow(0, placement.flat->begin, placement.flat->length).clone();
}

void place_into_whole(at::Tensor& whole, const Placement& placement, const at::Tensor& value) {
  at::Tensor box = box_of(whole, placement.box);
  if (!placement.flat) {
    box.copy_(value.reshape(placement.box.sizes));
    return;
  }
  at::Tensor staged = box.contiguous();  // box itself when it is the whole tensor
  staged.view(-1).narrow(0, placement.flat->begin, placement.flat->length).copy_(value.reshape(-1));
  if (!staged.is_same(box)) box.copy_(staged);
}

}  // namespace lightning::fabric
