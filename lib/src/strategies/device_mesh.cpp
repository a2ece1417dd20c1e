#include "lightning/fabric/strategies/device_mesh.h"

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"

namespace lightning::fabric {
DeviceMesh::DeviceMesh(Collective& world, int data_size, int tensor_size, std::array<std::string, 2> names)
    : names_(std::move(names)), data_size_(data_size), tensor_size_(tensor_size), rank_(world.rank()) {
  const int world_size = world.world_size();
  LF_CHECK(data_size > 0 && tensor_size > 0 && static_cast<int64_t>(data_size) * tensor_size == world_size, ValueError,
           "DeviceMesh: data_parallel_size=", data_size, " x tensor_parallel_size=", tensor_size,
           " does not make the world size ", world_size, ". Choose positive sizes whose product is ", world_size,
           ", or give only tensor_parallel_size (a divisor of ", world_size, "; data = world / tensor).");
  LF_CHECK(!names_[0].empty() && !names_[1].empty() && names_[0] != names_[1], ValueError, "DeviceMesh: dimension "
           "names \"", names_[0], "\" and \"", names_[1], "\" must be two different non-empty names (default "
           "\"data\", \"tensor\").");
  data_rank_ = rank_ / tensor_size;
  tensor_rank_ = rank_ % tensor_size;
  const std::string prefix = world.next_group_name("mesh") + "-";
  tensor_group_ = std::make_shared<Collective>(world, prefix + names_[1] + "-" + std::to_string(data_rank_),
                                               group_ranks(names_[1]));
  data_group_ = std::make_shared<Collective>(world, prefix + names_[0] + "-" + std::to_string(tensor_rank_),
                                             group_ranks(names_[0]));
}

DeviceMesh::~DeviceMesh() = default;

int DeviceMesh::dimension(const std::string& name) const {
  if (name == names_[0]) return 0;
  if (name == names_[1]) return 1;
  throw ValueError("DeviceMesh: no dimension \"" + name + "\". Its dimensions: \"" + names_[0] + "\" (" +
                   std::to_string(data_size_) + ") and \"" + names_[1] + "\" (" + std::to_string(tensor_size_) + ").");
}

int DeviceMesh::size(const std::string& name) const { return dimension(name) == 0 ? data_size_ : tensor_size_; }

uint64_t DeviceMesh::tensor_operations() const { return tensor_group_->operation_count(); }
uint64_t DeviceMesh::data_operations() const { return data_group_->operation_count(); }

int DeviceMesh::coordinate(const std::string& name) const {
  return dimension(name) == 0 ? data_rank_ : tensor_rank_;
}

std::vector<int> DeviceMesh::group_ranks(const std::string& name) const {
  std::vector<int> ranks;
  if (dimension(name) == 0) {
    for (int d = 0; d < data_size_; ++d) ranks.push_back(d * tensor_size_ + tensor_rank_);
  } else {
    for (int t = 0; t < tensor_size_; ++t) ranks.push_back(data_rank_ * tensor_size_ + t);
  }
  return ranks;
}

}  // namespace lightning::fabric
