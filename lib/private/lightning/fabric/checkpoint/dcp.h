// torch.distributed.checkpoint folders (layout: dcp_format.h) with LibTorch values: flattening a
// nested state the way Python's DCP flattens it, writing one rank's items, and reading any part of
// a tensor back from whatever boxes were saved (resharding). Nothing here is collective: the fsdp
// engine (sharded_checkpoint.h) decides who writes what and merges the ranks' metadata on rank 0.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lightning/fabric/checkpoint/dcp_format.h"
#include "lightning/fabric/checkpoint/placement.h"
#include "lightning/fabric/checkpoint/state.h"
#include "lightning/fabric/checkpoint/state_dict.h"

namespace torch::optim {
class Optimizer;
}

namespace lightning::fabric::zip {
class MappedFile;
}

namespace lightning::fabric::dcp {

/// One leaf of a nested state and its path.
struct Leaf {
  std::vector<PathElement> path;
  c10::IValue value;
};
/// The leaves as Python's DCP flattens a state: dicts by key; lists by index when they hold a
/// tensor, a dict or such a list; every other value (numbers, strings, tuples, plain lists) is one
/// leaf. Dict keys become their text ("0" for an optimizer's integer keys).
std::vector<Leaf> flatten_state(const StateDict& state);
/// The nested state again (lists rebuilt from their indices).
StateDict unflatten_state(const std::vector<Leaf>& leaves);

/// One item a rank saves: a whole value (no placement), or this rank's part of a tensor.
struct SaveItem {
  std::vector<PathElement> path;
  c10::IValue value;
  std::optional<Placement> placement;
};
/// Writes a rank's items, each box one torch.save archive, to folder/file (fsynced; file is
/// data_file_name(rank), or another name an s3:// save gives it) and returns the metadata of what
/// it wrote. Writes no file when items is empty.
Metadata write_rank_items(const std::filesystem::path& folder, const std::string& file, const std::vector<SaveItem>& items);
/// The metadata of the whole folder from every rank's: a tensor's chunks in rank order; any
/// other item from the first rank that has it.
Metadata merge_metadata(const std::vector<Metadata>& parts);

/// Reads values out of a folder; files are mapped once and kept while the reader lives.
class FolderReader {
 public:
  explicit FolderReader(std::filesystem::path folder);
  ~FolderReader();
  const Metadata& metadata() const { return metadata_; }
  /// A bytes item unpickled, or a whole tensor assembled from its chunks.
  c10::IValue value(const std::string& key);
  /// The part of tensor `key` that `wanted` places (its value: shaped wanted.local_shape()),
  /// from whatever boxes were saved. RuntimeError naming the key when they do not cover it.
  at::Tensor part(const std::string& key, const Placement& wanted);
  /// Elements [begin, begin + length) of the flattened tensor `key`, as a 1-D tensor (a part).
  at::Tensor flat_range(const std::string& key, int64_t begin, int64_t length);

 private:
  at::Tensor chunk(const std::string& key, const Item& item, size_t index);
  std::string_view bytes_of(const Location& location, const std::string& key);
  std::filesystem::path folder_;
  Metadata metadata_;
  std::map<std::string, std::unique_ptr<zip::MappedFile>> files_;
};

/// A leaf path as "a/b/0/c" (the slash paths of checkpoint/sharded.h).
inline std::string slash_path(const std::vector<PathElement>& path) { return join_path(path, '/'); }
/// True for a leaf under an optimizer entry's `section` ("state" or "param_groups").
bool is_optimizer_field(const std::vector<PathElement>& path, const char* section);
/// An optimizer leaf renamed as Python's sharded checkpoints name it: state keyed by parameter
/// name (names: the optimizer's parameters in index order), each group's "params" a list of names,
/// and "step" a 0-d float32 tensor.
void name_optimizer_leaf(Leaf& leaf, const std::vector<std::string>& names);
/// Adds the param_groups keys Python's optimizers hold and LibTorch's lack, at Python's defaults,
/// so that Python's torch.distributed.checkpoint.load finds every key of its own optimizer.
void add_python_group_defaults(StateDict& optimizer_dict, const torch::optim::Optimizer& optimizer);

/// How the checkpoint engine turns this rank's to_checkpoint(state) into its items (collect_save_items).
struct SaveRules {
  /// The optimizer's parameter names in index order (optimizer state is keyed by them).
  std::function<std::vector<std::string>(torch::optim::Optimizer& optimizer)> parameter_names;
  /// The placement of the leaf at slash_path (its path with optimizer indices); nullopt: whole.
  std::function<std::optional<Placement>(const std::string& slash_path)> place;
  bool writes_whole = false;  // this rank writes the whole values (rank 0); a part's own flag says for it
  /// Each group's "params" as the folder lists them, by optimizer entry ([entry][group]: names), in
  /// place of this rank's own; empty: every rank's own (ranks that hold every parameter).
  std::map<std::string, std::vector<std::vector<std::string>>> group_params;
};
/// The items of this rank's module and optimizer entries of `local` (the entries of `state`),
/// named as Python names them; every other entry goes whole into `rest` (Lightning's meta.pt).
std::vector<SaveItem> collect_save_items(const State& state, const StateDict& local, const SaveRules& rules,
                                         StateDict& rest);

}  // namespace lightning::fabric::dcp
