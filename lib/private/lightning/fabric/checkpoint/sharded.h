// Folders of the earlier sharded layout (sharded_format.h, the one description of it) read with
// LibTorch tensors: the fsdp strategy's loading and resharding, and fabric.load(path) of such a
// folder. Nothing here is collective.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "lightning/fabric/checkpoint/sharded_format.h"
#include "lightning/fabric/checkpoint/state_dict.h"

namespace lightning::fabric {

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
/// Elements `wanted` of one sharded tensor flattened, read from a folder written with any number
/// of parts (only the shard files that overlap are read; `cache` keeps them for the next
/// tensor).
at::Tensor read_resharded(const std::filesystem::path& folder, const ShardedLayout& layout,
                          const std::string& path, ShardSlice wanted, std::map<int, StateDict>& cache);

/// The whole checkpoint of a sharded folder, every tensor full: what `lightning-run model
/// consolidate` writes. RuntimeError naming the file for a missing or truncated shard.
StateDict consolidate_sharded_checkpoint(const std::filesystem::path& folder);

}  // namespace lightning::fabric
