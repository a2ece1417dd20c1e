// DeviceMesh: the job's ranks as an N-dimensional grid with named dimensions, and a process group
// along each dimension, as Python's init_device_mesh(shape, mesh_dim_names=...) builds them
// (docs/model-parallel.md, "The mesh"). The strategies name their dimensions "pipe", "replicate",
// "shard", "context" and "tensor", in that order (any subset); a mesh built by hand may use any
// names.
//
// Rank order is row-major, the first dimension outermost: with dimensions (pipe 2, replicate 2,
// tensor 2), rank = pipe x 4 + replicate x 2 + tensor. The last dimension's groups are consecutive
// ranks (one node's when its size divides the workers per node, where the traffic is heaviest).
// A dimension's group is the ranks that differ from this one in that coordinate only; a rank's
// position in it is its coordinate. Several dimensions make one group under a name of their own
// with flatten (Python's mesh[...]._flatten(name)): the strategies call replicate x shard "data"
// (every rank of a model replica reads the same samples; data ranks differ) and, under the pipeline,
// every dimension but pipe "stage". Groups use the world's backend (nccl on CUDA, shm on one
// machine, gloo otherwise).
#pragma once

#include "lightning/fabric/export.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace lightning::fabric {

class Collective;  // the process group (private to the library)

/// One dimension of a mesh: its name and how many ranks lie along it.
struct LF_API MeshDimension {
  std::string name;
  int size = 1;
};

class LF_API DeviceMesh {
 public:
  /// Splits world's ranks into a grid of these dimensions, the first outermost (collective over
  /// world: every rank builds the same meshes in the same order). ValueError naming every size and
  /// the world size unless the sizes are positive and their product is the world size; ValueError
  /// for no dimension, an empty name or a name given twice. world must outlive every flatten
  /// call; the shared_ptr form keeps it alive for them (the strategies' meshes).
  DeviceMesh(Collective& world, std::vector<MeshDimension> dimensions);
  DeviceMesh(std::shared_ptr<Collective> world, std::vector<MeshDimension> dimensions);
  ~DeviceMesh();
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;

  /// The dimensions' names and sizes, outermost first.
  std::vector<std::string> names() const;
  std::vector<int> shape() const;
  /// Whether name is a dimension or a flattened group of this mesh.
  bool has(const std::string& name) const;
  /// By a dimension's name or a flattened group's: its size, this rank's coordinate (its position
  /// in the group), the group's global ranks in group order, the group. ValueError naming the
  /// mesh's dimensions and flattened groups for any other name.
  int size(const std::string& name) const;
  int coordinate(const std::string& name) const;
  std::vector<int> group_ranks(const std::string& name) const;
  Collective& group(const std::string& name) const;
  const std::shared_ptr<Collective>& shared_group(const std::string& name) const;
  /// Collectives issued so far over this rank's group of name (benchmarks count them).
  uint64_t operations(const std::string& name) const;

  /// Makes the dimensions `dimensions` (in mesh order, any number, none allowed) one group called
  /// name: the ranks that share every other coordinate. One dimension reuses its group; none is
  /// this rank alone. Collective over world (every rank flattens the same names in the same order).
  /// ValueError for a name in use or a dimension the mesh lacks.
  void flatten(const std::vector<std::string>& dimensions, const std::string& name);
  /// The mesh of this rank's ranks along `dimensions` (in mesh order), sharing this mesh's groups,
  /// with the flattened groups whose dimensions it holds. Not collective.
  std::shared_ptr<DeviceMesh> submesh(const std::vector<std::string>& dimensions) const;

 private:
  struct Grid;
  DeviceMesh() = default;
  const std::vector<int>& dims_of(const std::string& name) const;  // indices; ValueError when unknown
  std::shared_ptr<Grid> grid_;          // the world's grid, shared with sub-meshes
  std::vector<int> own_;                // this mesh's dimensions, indices into the grid
  std::map<std::string, std::vector<int>> named_;  // dimension or flattened name -> grid indices
};

}  // namespace lightning::fabric
