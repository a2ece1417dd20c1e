#include "lightning/fabric/checkpoint/sharded.h"

#include <torch/types.h>

#include <sstream>

#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

namespace {
// The key of dict that a path element names: an existing key whose text or decimal form equals it
// (files hold untagged dicts, so an int-keyed dict is known by its keys), else a new key of the
// dict's key type.
c10::IValue key_for(const StateDict& dict, const std::string& element) {
  for (const auto& item : dict) {
    const c10::IValue& key = item.key();
    if ((key.isString() && key.toStringRef() == element) || (key.isInt() && std::to_string(key.toInt()) == element)) {
      return key;
    }
  }
  if (dict.keyType()->kind() == c10::TypeKind::IntType) return static_cast<int64_t>(std::stoll(element));
  return element;
}

// The dtype metadata.json names for a tensor (c10's names), as a ScalarType.
c10::ScalarType dtype_of(const fs::path& folder, const std::string& path, const ShardedTensorLayout& tensor) {
  static const std::map<std::string, c10::ScalarType> dtypes = {
      {"Float", torch::kFloat32}, {"Double", torch::kFloat64}, {"Half", torch::kFloat16}, {"BFloat16", torch::kBFloat16},
      {"Long", torch::kInt64},    {"Int", torch::kInt32},      {"Bool", torch::kBool},    {"Byte", torch::kUInt8}};
  auto dtype = dtypes.find(tensor.dtype);
  LF_CHECK(dtype != dtypes.end(), RuntimeError, "metadata.json of ", folder.string(), ": unknown dtype \"",
           tensor.dtype, "\" for ", path, ".");
  return dtype->second;
}
}  // namespace

void insert_at_path(StateDict& root, const std::string& path, const c10::IValue& value) {
  const auto elements = split_checkpoint_path(path);
  StateDict current = root;  // dicts share their storage: edits reach root
  for (size_t i = 0; i + 1 < elements.size(); ++i) {
    const c10::IValue key = key_for(current, elements[i]);
    auto found = current.find(key);
    if (found == current.end()) {
      current.insert(key, make_state_dict());
      found = current.find(key);
    }
    LF_CHECK(found->value().isGenericDict(), RuntimeError, "Checkpoint path ", path, ": '", elements[i],
             "' is not a dictionary.");
    current = found->value().toGenericDict();
  }
  current.insert_or_assign(key_for(current, elements.back()), value);
}

at::Tensor tensor_at_path(const StateDict& root, const std::string& path) {
  const auto elements = split_checkpoint_path(path);
  StateDict current = root;
  for (size_t i = 0; i < elements.size(); ++i) {
    auto found = current.find(key_for(current, elements[i]));
    LF_CHECK(found != current.end(), RuntimeError, "Checkpoint path ", path, " does not exist.");
    if (i + 1 == elements.size()) {
      LF_CHECK(found->value().isTensor(), RuntimeError, "Checkpoint path ", path, " is not a tensor.");
      return found->value().toTensor();
    }
    LF_CHECK(found->value().isGenericDict(), RuntimeError, "Checkpoint path ", path, " does not exist.");
    current = found->value().toGenericDict();
  }
  throw RuntimeError("Checkpoint path " + path + " is empty.");
}

bool remove_at_path(StateDict& root, const std::string& path) {
  const auto elements = split_checkpoint_path(path);
  StateDict current = root;
  for (size_t i = 0; i + 1 < elements.size(); ++i) {
    auto found = current.find(key_for(current, elements[i]));
    if (found == current.end() || !found->value().isGenericDict()) return false;
    current = found->value().toGenericDict();
  }
  return current.erase(key_for(current, elements.back())) > 0;
}

at::Tensor slice_for_part(const at::Tensor& whole, int parts, int part) {
  const ShardSlice slice = shard_slice(whole.numel(), parts, part);
  return whole.reshape(-1).narrow(0, slice.begin, slice.length).clone();
}

namespace {
const StateDict& shard_file(const fs::path& folder, const ShardedLayout& metadata, int part,
                            std::map<int, StateDict>& cache) {
  auto found = cache.find(part);
  if (found != cache.end()) return found->second;
  const fs::path file = folder / shard_file_name(part, metadata.parts);
  LF_CHECK(fs::is_regular_file(file), RuntimeError, "Sharded checkpoint ", folder.string(), " is incomplete: ",
           file.filename().string(), " is missing (it was saved by ", metadata.parts, " shard writers).");
  return cache.emplace(part, load_state_dict_file(file)).first->second;
}

at::Tensor shard_tensor(const StateDict& shard, const fs::path& folder, int part, const ShardedLayout& metadata,
                        const std::string& path) {
  auto found = shard.find(path);
  LF_CHECK(found != shard.end() && found->value().isTensor(), RuntimeError, "Sharded checkpoint ", folder.string(),
           ": ", shard_file_name(part, metadata.parts), " lacks tensor ", path, ".");
  return found->value().toTensor();
}
}  // namespace

at::Tensor read_resharded(const fs::path& folder, const ShardedLayout& metadata, const std::string& path,
                          ShardSlice wanted, std::map<int, StateDict>& cache) {
  const ShardedTensorLayout& info = metadata.tensors.at(path);
  at::Tensor result = torch::empty({wanted.length}, torch::TensorOptions().dtype(dtype_of(folder, path, info)));
  for (int old = 0; old < metadata.parts && wanted.length > 0; ++old) {
    const ShardSlice held = shard_slice(info.numel(), metadata.parts, old);
    const int64_t begin = std::max(held.begin, wanted.begin);
    const int64_t end = std::min(held.begin + held.length, wanted.begin + wanted.length);
    if (begin >= end) continue;
    const at::Tensor piece = shard_tensor(shard_file(folder, metadata, old, cache), folder, old, metadata, path);
    LF_CHECK(piece.numel() == held.length, RuntimeError, "Sharded checkpoint ", folder.string(), ": ",
             shard_file_name(old, metadata.parts), " holds ", piece.numel(), " values of ", path, ", expected ",
             held.length, ".");
    result.narrow(0, begin - wanted.begin, end - begin).copy_(piece.narrow(0, begin - held.begin, end - begin));
  }
  return result;
}

StateDict consolidate_sharded_checkpoint(const fs::path& folder) {
  const ShardedLayout metadata = read_sharded_layout(folder);
  const fs::path common = folder / "common.pt";
  LF_CHECK(fs::is_regular_file(common), RuntimeError, "Sharded checkpoint ", folder.string(),
           " is incomplete: common.pt is missing.");
  StateDict whole = load_state_dict_file(common);
  std::map<int, StateDict> cache;
  for (const auto& [path, info] : metadata.tensors) {
    at::Tensor full = read_resharded(folder, metadata, path, ShardSlice{0, info.numel()}, cache);
    insert_at_path(whole, path, full.view(info.shape));
  }
  return whole;
}

}  // namespace lightning::fabric
