// Where one rank's value of a tensor lies in the whole tensor: the one question every sharded
// strategy answers for the checkpoint engine (checkpoint/sharded_checkpoint.h). A value is
//   - whole: no placement; every rank holds the same tensor and rank 0 saves it;
//   - a box of the whole tensor (a tensor-parallel slice): `box`, value shaped box.sizes;
//   - a flat range of the whole tensor (an fsdp shard): box = the whole tensor, `flat` set, value 1-D;
//   - a flat range of a box (fsdp over a tensor-parallel slice): both.
// Nothing here is collective and nothing touches files.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric/checkpoint/dcp_format.h"
#include "lightning/fabric/checkpoint/sharded_format.h"

namespace lightning::fabric {

struct Placement {
  std::vector<int64_t> global_shape;  // the whole tensor's
  dcp::Box box;                       // the part of the whole tensor the value is cut from
  std::optional<ShardSlice> flat;     // set: the value is elements [begin, begin + length) of box, flattened
  bool writes = true;                 // this rank saves its value (one replica of every part does)

  /// The whole tensor of this shape: box at the origin, nothing flat.
  static Placement whole(const std::vector<int64_t>& shape);
  /// The value's shape: {flat->length} when flat, else box.sizes.
  std::vector<int64_t> local_shape() const;
  /// The boxes of the whole tensor that make up the value, in the value's row-major order
  /// (one box, or the flat range's boxes; none for an empty range).
  std::vector<dcp::Box> boxes() const;
};

/// RuntimeError naming `what` and both shapes unless `saved` (a checkpoint's whole tensor) has
/// placement's global shape: the checkpoint comes from another model.
void check_global_shape(c10::IntArrayRef saved, const Placement& placement, const std::string& what);
/// The value `placement` describes, cut out of the whole tensor (a copy), after
/// check_global_shape.
at::Tensor part_of_whole(const at::Tensor& whole, const Placement& placement, const std::string& what);
/// Copies value into its place inside `whole` (shaped placement.global_shape).
void place_into_whole(at::Tensor& whole, const Placement& placement, const at::Tensor& value);

}  // namespace lightning::fabric
