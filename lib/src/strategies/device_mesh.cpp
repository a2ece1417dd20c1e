#include "lightning/fabric/strategies/device_mesh.h"

#include <algorithm>
#include <set>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"

namespace lightning::fabric {

// The world's grid, shared by a mesh and its sub-meshes: the dimensions, this rank's coordinates
// and every group formed so far, by name.
struct DeviceMesh::Grid {
  std::shared_ptr<Collective> world;  // null-deleting when the mesh was given a reference
  std::string prefix;  // unique to this mesh among the world's groups
  std::vector<MeshDimension> dimensions;
  std::vector<int> strides, coordinates;
  std::map<std::string, std::vector<int>> named;  // every dimension and flattened name -> indices
  std::map<std::string, std::shared_ptr<Collective>> groups;

  int rank_with(const std::vector<int>& indices, int position) const {  // position: row-major over indices
    std::vector<int> coordinates_here = coordinates;
    for (auto d = indices.rbegin(); d != indices.rend(); ++d) {
      const int size = dimensions[static_cast<size_t>(*d)].size;
      coordinates_here[static_cast<size_t>(*d)] = position % size;
      position /= size;
    }
    int rank = 0;
    for (size_t d = 0; d < dimensions.size(); ++d) rank += coordinates_here[d] * strides[d];
    return rank;
  }
  int size_of(const std::vector<int>& indices) const {
    int size = 1;
    for (int d : indices) size *= dimensions[static_cast<size_t>(d)].size;
    return size;
  }
  int coordinate_of(const std::vector<int>& indices) const {
    int position = 0;
    for (int d : indices) position = position * dimensions[static_cast<size_t>(d)].size + coordinates[static_cast<size_t>(d)];
    return position;
  }
  std::vector<int> ranks_of(const std::vector<int>& indices) const {
    std::vector<int> ranks;
    for (int p = 0; p < size_of(indices); ++p) ranks.push_back(rank_with(indices, p));
    return ranks;
  }
  // The group's name in the world: the mesh, the group's name and this rank's other coordinates.
  std::string group_name(const std::string& name, const std::vector<int>& indices) const {
    std::string full = prefix + name;
    for (size_t d = 0; d < dimensions.size(); ++d) {
      if (std::find(indices.begin(), indices.end(), static_cast<int>(d)) == indices.end()) {
        full += "-" + std::to_string(coordinates[d]);
      }
    }
    return full;
  }
  std::string described() const {
    std::string text;
    for (const auto& [name, indices] : named) {
      text += (text.empty() ? "\"" : ", \"") + name + "\" (" + std::to_string(size_of(indices)) + ")";
    }
    return text;
  }
};

DeviceMesh::DeviceMesh(Collective& world, std::vector<MeshDimension> dimensions)
    : DeviceMesh(std::shared_ptr<Collective>(std::shared_ptr<Collective>(), &world), std::move(dimensions)) {}

DeviceMesh::DeviceMesh(std::shared_ptr<Collective> shared_world, std::vector<MeshDimension> dimensions)
    : grid_(std::make_shared<Grid>()) {
  Collective& world = *shared_world;
  const int world_size = world.world_size();
  std::string shape;
  int64_t product = 1;
  bool positive = true;
  std::set<std::string> seen;
  for (const auto& dimension : dimensions) {
    shape += (shape.empty() ? "" : ", ") + dimension.name + " " + std::to_string(dimension.size);
    product *= dimension.size;
    positive = positive && dimension.size > 0;
    LF_CHECK(!dimension.name.empty() && seen.insert(dimension.name).second, ValueError, "DeviceMesh: dimension names "
             "must be distinct and non-empty, but (", shape, ") names \"", dimension.name, "\" ",
             dimension.name.empty() ? "empty" : "twice", ". Name each dimension once (the strategies use \"pipe\", "
             "\"replicate\", \"shard\", \"context\" and \"tensor\").");
  }
  LF_CHECK(!dimensions.empty() && positive && product == world_size, ValueError, "DeviceMesh: the dimensions (",
           shape, ") make ", dimensions.empty() ? 0 : product, " ranks, not the world size ", world_size,
           ". Choose positive sizes whose product is ", world_size, ".");
  Grid& grid = *grid_;
  grid.world = std::move(shared_world);
  grid.prefix = world.next_group_name("mesh") + "-";
  grid.dimensions = std::move(dimensions);
  const size_t n = grid.dimensions.size();
  grid.strides.assign(n, 1);
  grid.coordinates.assign(n, 0);
  for (size_t d = n - 1; d > 0; --d) grid.strides[d - 1] = grid.strides[d] * grid.dimensions[d].size;
  for (size_t d = 0; d < n; ++d) grid.coordinates[d] = world.rank() / grid.strides[d] % grid.dimensions[d].size;
  // Every rank forms the groups in dimension order, so each group's members all reach it.
  for (size_t d = 0; d < n; ++d) {
    const std::string& name = grid.dimensions[d].name;
    const std::vector<int> indices{static_cast<int>(d)};
    grid.named[name] = indices;
    grid.groups[name] = std::make_shared<Collective>(world, grid.group_name(name, indices), grid.ranks_of(indices));
    own_.push_back(static_cast<int>(d));
    named_[name] = indices;
  }
}

DeviceMesh::~DeviceMesh() = default;

const std::vector<int>& DeviceMesh::dims_of(const std::string& name) const {
  auto found = named_.find(name);
  if (found != named_.end()) return found->second;
  std::string known;
  for (const auto& [have, indices] : named_) {
    known += (known.empty() ? "\"" : ", \"") + have + "\" (" + std::to_string(grid_->size_of(indices)) + ")";
  }
  throw ValueError("DeviceMesh: no dimension or flattened group \"" + name + "\". This mesh has " + known + ".");
}

std::vector<std::string> DeviceMesh::names() const {
  std::vector<std::string> names;
  for (int d : own_) names.push_back(grid_->dimensions[static_cast<size_t>(d)].name);
  return names;
}

std::vector<int> DeviceMesh::shape() const {
  std::vector<int> shape;
  for (int d : own_) shape.push_back(grid_->dimensions[static_cast<size_t>(d)].size);
  return shape;
}

bool DeviceMesh::has(const std::string& name) const { return named_.count(name) != 0; }
int DeviceMesh::size(const std::string& name) const { return grid_->size_of(dims_of(name)); }
int DeviceMesh::coordinate(const std::string& name) const { return grid_->coordinate_of(dims_of(name)); }
std::vector<int> DeviceMesh::group_ranks(const std::string& name) const { return grid_->ranks_of(dims_of(name)); }

const std::shared_ptr<Collective>& DeviceMesh::shared_group(const std::string& name) const {
  dims_of(name);  // ValueError when unknown
  return grid_->groups.at(name);
}

Collective& DeviceMesh::group(const std::string& name) const { return *shared_group(name); }
uint64_t DeviceMesh::operations(const std::string& name) const { return group(name).operation_count(); }

void DeviceMesh::flatten(const std::vector<std::string>& dimensions, const std::string& name) {
  LF_CHECK(!name.empty() && grid_->named.count(name) == 0, ValueError, "DeviceMesh::flatten: the name \"", name,
           "\" is ", name.empty() ? "empty" : "in use already", ". The mesh has ", grid_->described(),
           "; give the flattened group a new name.");
  std::vector<int> indices;
  for (const auto& dimension : dimensions) {
    const auto& found = dims_of(dimension);
    LF_CHECK(found.size() == 1, ValueError, "DeviceMesh::flatten: \"", dimension, "\" is a flattened group; name the "
             "dimensions it is made of.");
    indices.push_back(found.front());
  }
  std::sort(indices.begin(), indices.end());
  indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
  std::shared_ptr<Collective> group;
  if (indices.size() == 1) {
    group = grid_->groups.at(grid_->dimensions[static_cast<size_t>(indices.front())].name);
  } else {
    group = std::make_shared<Collective>(*grid_->world, grid_->group_name(name, indices), grid_->ranks_of(indices));
  }
  grid_->named[name] = indices;
  grid_->groups[name] = std::move(group);
  named_[name] = indices;
}

std::shared_ptr<DeviceMesh> DeviceMesh::submesh(const std::vector<std::string>& dimensions) const {
  std::shared_ptr<DeviceMesh> sub(new DeviceMesh());
  sub->grid_ = grid_;
  for (const auto& dimension : dimensions) {
    const auto& found = dims_of(dimension);
    LF_CHECK(found.size() == 1, ValueError, "DeviceMesh::submesh: \"", dimension, "\" is a flattened group; name the "
             "dimensions it is made of.");
    sub->own_.push_back(found.front());
  }
  std::sort(sub->own_.begin(), sub->own_.end());
  sub->own_.erase(std::unique(sub->own_.begin(), sub->own_.end()), sub->own_.end());
  for (const auto& [name, indices] : grid_->named) {
    const bool inside = std::all_of(indices.begin(), indices.end(), [&](int d) {
      return std::find(sub->own_.begin(), sub->own_.end(), d) != sub->own_.end();
    });
    if (inside && named_.count(name) != 0) sub->named_[name] = indices;
  }
  return sub;
}

}  // namespace lightning::fabric
