// Sharded checkpoint folders (layout: sharded_format.h) read and written with LibTorch tensors:
// the fsdp strategy's saving, loading and resharding. Nothing here is collective.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "lightning/fabric/checkpoint/sharded_format.h"
#include "lightning/fabric/checkpoint/state_dict.h"

namespace lightning::fabric {

struct ShardedTensorInfo {
  std::vector<int64_t> shape;
  c10::ScalarType dtype = c10::ScalarType::Float;
  int64_t numel() const;
};

struct ShardedMetadata {
  int world_size = 1;  // ranks of the run that saved
  int parts = 1;       // shard files
  std::map<std::string, ShardedTensorInfo> tensors;
};

void write_sharded_metadata(const std::filesystem::path& folder, const ShardedMetadata& metadata);
/// RuntimeError naming the folder for a missing path, a file instead of a folder, a folder without
/// metadata.json (not a sharded checkpoint) or unreadable metadata.
ShardedMetadata read_sharded_metadata(const std::filesystem::path& folder);

/// Inserts (or replaces) value at a "/"-separated path inside nested dicts; integer-keyed dicts
/// (an optimizer's "state") take the path element as a number. Missing intermediate dicts are
/// created with string keys.
void insert_at_path(StateDict& root, const std::string& path, const c10::IValue& value);
/// The tensor at path (RuntimeError naming the path when there is none).
at::Tensor tensor_at_path(const StateDict& root, const std::string& path);
/// Removes the value at path; false when there was none.
bool remove_at_path(StateDict& root, const std::string& path);

/// This part's slice of every sharded tensor of a checkpoint read as a whole.
at::Tensor slice_for_part(const at::Tensor& whole, int parts, int part);
/// The part-`part`-of-`parts` slice of one sharded tensor, read from a folder written with any
/// number of parts (only the shard files that overlap are read; `cache` keeps them for the next
/// tensor).
at::Tensor read_resharded(const std::filesystem::path& folder, const ShardedMetadata& metadata,
                          const std::string& path, int parts, int part, std::map<int, StateDict>& cache);

/// The whole checkpoint of a sharded folder, every tensor full: what `lightning-run model
/// consolidate` writes. RuntimeError naming the file for a missing or truncated shard.
StateDict consolidate_sharded_checkpoint(const std::filesystem::path& folder);

}  // namespace lightning::fabric
