// DeviceMesh: the job's ranks as a 2-D grid (data x tensor), with a process group along each row
// and each column, as Python's init_device_mesh(("data", "tensor")) builds for
// ModelParallelStrategy (docs/model-parallel.md, "The mesh").
//
// Rank order: rank = data_rank x tensor_size + tensor_rank. The tensor dimension is innermost, so
// a tensor-parallel group is tensor_size consecutive ranks (one node's when tensor_size divides
// the workers per node, where the traffic is heaviest), and a data-parallel group is the ranks
// tensor_size apart: with 8 ranks as (2, 4), tensor groups {0,1,2,3} and {4,5,6,7}, data groups
// {0,4}, {1,5}, {2,6}, {3,7}. In each group a rank's position is its coordinate along that
// dimension. Groups use the world's backend (nccl on CUDA, shm on one machine, gloo otherwise).
#pragma once

#include "lightning/fabric/export.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lightning::fabric {

class Collective;  // the process group (private to the library)

class LF_API DeviceMesh {
 public:
  /// Splits world's ranks into a data_size x tensor_size grid (collective over world: every rank
  /// calls it with the same sizes and names, in the same order as any other mesh). ValueError
  /// naming both sizes and the world size unless data_size x tensor_size == world size, both
  /// positive; or when the names are empty or equal.
  DeviceMesh(Collective& world, int data_size, int tensor_size,
             std::array<std::string, 2> names = {"data", "tensor"});
  ~DeviceMesh();
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;

  /// (data_size, tensor_size).
  std::array<int, 2> shape() const { return {data_size_, tensor_size_}; }
  const std::array<std::string, 2>& names() const { return names_; }
  int data_size() const { return data_size_; }
  int tensor_size() const { return tensor_size_; }
  /// This rank's coordinates: its position in its data group and in its tensor group.
  int data_rank() const { return data_rank_; }
  int tensor_rank() const { return tensor_rank_; }
  /// The size of, and this rank's coordinate along, the dimension called name; ValueError naming
  /// the dimensions otherwise.
  int size(const std::string& name) const;
  int coordinate(const std::string& name) const;
  /// The global ranks of this rank's group along the dimension called name, in group order.
  std::vector<int> group_ranks(const std::string& name) const;
  /// Collectives issued so far over the tensor group and over the data group (benchmarks count them).
  uint64_t tensor_operations() const;
  uint64_t data_operations() const;

  /// The groups this rank belongs to (for the library's tensor-parallel layers and strategies).
  Collective& data_group() const { return *data_group_; }
  Collective& tensor_group() const { return *tensor_group_; }
  const std::shared_ptr<Collective>& shared_data_group() const { return data_group_; }
  const std::shared_ptr<Collective>& shared_tensor_group() const { return tensor_group_; }

 private:
  int dimension(const std::string& name) const;
  std::array<std::string, 2> names_;
  int data_size_ = 1, tensor_size_ = 1, data_rank_ = 0, tensor_rank_ = 0, rank_ = 0;
  std::shared_ptr<Collective> data_group_, tensor_group_;
};

}  // namespace lightning::fabric
