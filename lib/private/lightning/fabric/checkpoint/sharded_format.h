// The project's earlier sharded checkpoint layout (docs/checkpoints.md, "Folders of the earlier
// layout"), without LibTorch: read by the fsdp strategy (which reshards such folders on load) and
// by `lightning-run model consolidate`; nothing writes it any more (fsdp writes dcp_format.h's):
//   DIR/metadata.json      {"format": "lightning-fabric-sharded", "version": 1, "world_size",
//                          "parts", "tensors": {path: {"shape": [...], "dtype": "Float"}}}
//   DIR/common.pt          the checkpoint without the sharded tensors, written once
//   DIR/shard-R-of-P.pt    part R's slice of every sharded tensor, flattened: {path: 1-D tensor}
// Part R of a tensor with N elements holds [R * ceil(N / P), min((R + 1) * ceil(N / P), N)) of
// its flattened values, so any number of ranks can reshard it. Nothing here is collective.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace lightning::fabric {

/// Where a flattened tensor of numel elements splits over `parts` ranks: chunk = ceil(numel /
/// parts); part r holds [r * chunk, min((r + 1) * chunk, numel)).
struct ShardSlice {
  int64_t begin = 0;
  int64_t length = 0;
};
ShardSlice shard_slice(int64_t numel, int parts, int part);

/// Elements of a tensor of this shape, and the strides of its contiguous (row-major) layout.
int64_t element_count(const std::vector<int64_t>& shape);
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);

struct ShardedTensorLayout {
  std::vector<int64_t> shape;
  std::string dtype = "Float";  // c10's names: "Float", "Double", "Half", "BFloat16", "Long", ...
  int64_t numel() const;
};

struct ShardedLayout {
  int world_size = 1;  // ranks of the run that saved
  int parts = 1;       // shard files
  std::map<std::string, ShardedTensorLayout> tensors;
};

std::string shard_file_name(int part, int parts);
/// The elements of a "/"-separated path inside a checkpoint ("optimizer/state/0/exp_avg").
std::vector<std::string> split_checkpoint_path(const std::string& path);
/// Writes DIR/metadata.json atomically.
void write_sharded_layout(const std::filesystem::path& folder, const ShardedLayout& layout);
/// RuntimeError naming the folder for a missing path, a file instead of a folder, a folder without
/// metadata.json (not a sharded checkpoint) or unreadable metadata.
ShardedLayout read_sharded_layout(const std::filesystem::path& folder);
/// True when folder holds a metadata.json.
bool is_sharded_checkpoint(const std::filesystem::path& folder);

}  // namespace lightning::fabric
