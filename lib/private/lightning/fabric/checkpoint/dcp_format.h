// The layout of a torch.distributed.checkpoint (DCP) folder, what Python's
// torch.distributed.checkpoint and Lightning Fabric's FSDP strategy read and write, without LibTorch
// (docs/checkpoints.md, "Sharded checkpoints"):
//   DIR/.metadata        a pickle of torch.distributed.checkpoint.metadata.Metadata: for every
//                        flattened key its kind (a tensor with dtype, size and the boxes that were
//                        saved, or opaque bytes), where each box's bytes lie, and the key's path
//                        in the nested state (planner_data)
//   DIR/__R_0.distcp     rank R's items, each one torch.save archive, back to back
//   DIR/meta.pt          Lightning's file of the entries that are neither a module nor an optimizer
// Shared by the fsdp strategy (which writes and reshards folders) and `lightning-run model
// consolidate`. Nothing here is collective.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lightning::fabric::dcp {

/// A box inside a tensor (DCP's ChunkStorageMetadata): per dimension its first index and extent.
/// A 0-d tensor has one box with no dimensions.
struct Box {
  std::vector<int64_t> offsets, sizes;
  int64_t numel() const;
  bool operator==(const Box& other) const { return offsets == other.offsets && sizes == other.sizes; }
};

/// The boxes that make up elements [begin, begin + length) of a row-major tensor of this shape,
/// in order; each is itself contiguous in the tensor. At most 2 x dims - 1 boxes; none for length 0.
std::vector<Box> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t length);
/// The common part of two boxes of one tensor, or nullopt when they do not overlap.
std::optional<Box> intersect(const Box& a, const Box& b);
/// Offset of box `inner` relative to box `outer` (inner inside outer).
std::vector<int64_t> relative_offsets(const Box& inner, const Box& outer);

/// Where an item's bytes lie (filesystem._StorageInfo): a file of the folder and a byte range.
struct Location {
  std::string file;
  uint64_t offset = 0, length = 0;
};

/// One element of a key's path in the nested state: a dict key, or a list index (index >= 0).
struct PathElement {
  std::string key;
  int64_t index = -1;
};

struct Item {
  enum class Kind { Tensor, Bytes };
  Kind kind = Kind::Bytes;
  std::string dtype;                // Tensor: c10's name ("Float", "BFloat16", "Long", ...)
  std::vector<int64_t> size;        // Tensor: the whole tensor's shape
  bool requires_grad = false;       // Tensor
  std::vector<Box> chunks;          // Tensor: the saved boxes
  std::vector<Location> locations;  // one per chunk; Bytes: exactly one
  std::vector<PathElement> path;    // the nesting (planner_data); empty: the flattened key itself
};

/// The whole .metadata: items by flattened key, in the order they were written.
struct Metadata {
  std::vector<std::string> order;
  std::map<std::string, Item> items;
  void add(const std::string& key, Item item);
};

constexpr const char* kMetadataFile = ".metadata";
constexpr const char* kLightningMetaFile = "meta.pt";
/// "__R_0.distcp": the file rank R writes.
std::string data_file_name(int rank);
/// A path's elements joined with `separator` (list indices in decimal).
std::string join_path(const std::vector<PathElement>& path, char separator);
/// The flattened key of a path, as torch.distributed.checkpoint names it: "a.b.0.c".
inline std::string flat_key(const std::vector<PathElement>& path) { return join_path(path, '.'); }

/// torch's dtype name for c10's ("Float" -> "float32"), and back; empty for an unknown one.
std::string torch_dtype_name(const std::string& c10_name);
std::string c10_dtype_name(const std::string& torch_name);
/// Bytes per element of a c10 dtype name; 0 for an unknown one.
int dtype_size(const std::string& c10_name);

/// The pickle Python's torch.distributed.checkpoint reads as its Metadata.
std::string write_metadata(const Metadata& metadata);
/// RuntimeError naming `what` for a pickle that is not a DCP Metadata.
Metadata parse_metadata(std::string_view bytes, const std::string& what);
/// RuntimeError naming the folder for a missing folder or .metadata, or an unreadable one.
Metadata read_metadata(const std::filesystem::path& folder);
/// True when folder holds a .metadata file.
bool is_dcp_checkpoint(const std::filesystem::path& folder);

}  // namespace lightning::fabric::dcp
