#include "lightning/fabric/checkpoint/dcp.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/types.h>

#include "lightning/fabric/checkpoint/atomic_file.h"
#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/checkpoint/zip_archive.h"
#include "lightning/fabric/errors.h"

namespace lightning::fabric::dcp {

namespace fs = std::filesystem;

namespace {
bool is_terminal(const c10::IValue& value);

bool holds_containers(const c10::IValue& value) {
  if (value.isGenericDict()) return true;
  if (value.isTensor()) return true;
  if (value.isList()) return !is_terminal(value);
  return false;
}

// Python's _is_terminal: a list is a leaf unless it holds a dict, a tensor or a non-leaf list.
bool is_terminal(const c10::IValue& value) {
  if (value.isGenericDict()) return false;
  if (!value.isList()) return true;
  for (const c10::IValue item : value.toList()) {
    if (holds_containers(item)) return false;
  }
  return true;
}

std::string key_text(const c10::IValue& key) {
  if (key.isString()) return key.toStringRef();
  if (key.isInt()) return std::to_string(key.toInt());
  LF_CHECK(false, ValueError, "torch.distributed.checkpoint: a state key of type ", key.tagKind(),
           " has no text form; use string or integer keys.");
}

void flatten_into(std::vector<PathElement>& path, const c10::IValue& value, std::vector<Leaf>& out) {
  if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict()) {
      path.push_back({key_text(item.key()), -1});
      flatten_into(path, item.value(), out);
      path.pop_back();
    }
  } else if (is_terminal(value)) {
    out.push_back({path, value});
  } else {
    const auto list = value.toList();
    for (size_t i = 0; i < list.size(); ++i) {
      path.push_back({"", static_cast<int64_t>(i)});
      flatten_into(path, list.get(i), out);
      path.pop_back();
    }
  }
}

// Builds the nested value for leaves that share path[0..depth).
c10::IValue build(const std::vector<const Leaf*>& leaves, size_t depth) {
  if (leaves.size() == 1 && leaves[0]->path.size() == depth) return leaves[0]->value;
  std::vector<std::string> order;
  std::map<std::string, std::vector<const Leaf*>> groups;
  bool as_list = true;
  int64_t largest = -1;
  for (const Leaf* leaf : leaves) {
    LF_CHECK(leaf->path.size() > depth, RuntimeError, "torch.distributed.checkpoint: the key ", flat_key(leaf->path),
             " is both a value and a container in the checkpoint.");
    const PathElement& element = leaf->path[depth];
    const std::string name = element.index >= 0 ? std::to_string(element.index) : element.key;
    if (element.index < 0) as_list = false;
    largest = std::max(largest, element.index);
    if (groups.find(name) == groups.end()) order.push_back(name);
    groups[name].push_back(leaf);
  }
  if (as_list) {
    c10::impl::GenericList list(c10::AnyType::get());
    for (int64_t i = 0; i <= largest; ++i) {
      auto found = groups.find(std::to_string(i));
      list.push_back(found == groups.end() ? c10::IValue() : build(found->second, depth + 1));
    }
    return list;
  }
  StateDict dict = make_state_dict();
  for (const std::string& name : order) dict.insert(name, build(groups[name], depth + 1));
  return dict;
}

c10::ScalarType scalar_type_of(const std::string& name) {
  for (c10::ScalarType type : {c10::kFloat, c10::kDouble, c10::kHalf, c10::kBFloat16, c10::kLong, c10::kInt, c10::kShort,
                               c10::kChar, c10::kByte, c10::kBool}) {
    if (name == c10::toString(type)) return type;
  }
  throw RuntimeError("torch.distributed.checkpoint: dtype " + name + " is not supported here.");
}

// Whether a torch.save of tensor writes only its own elements: contiguous, over all of its storage.
bool covers_its_storage(const at::Tensor& tensor) {
  return tensor.is_contiguous() && tensor.storage_offset() == 0 &&
         tensor.storage().nbytes() == static_cast<size_t>(tensor.numel()) * tensor.element_size();
}

// The part of `tensor` (shaped like box `outer`) that box `inner` covers.
at::Tensor sub_box(at::Tensor tensor, const Box& inner, const Box& outer) {
  const std::vector<int64_t> at = relative_offsets(inner, outer);
  for (size_t d = 0; d < at.size(); ++d) tensor = tensor.narrow(static_cast<int64_t>(d), at[d], inner.sizes[d]);
  return tensor;
}
}  // namespace

std::vector<Leaf> flatten_state(const StateDict& state) {
  std::vector<Leaf> out;
  std::vector<PathElement> path;
  flatten_into(path, c10::IValue(state), out);
  return out;
}

StateDict unflatten_state(const std::vector<Leaf>& leaves) {
  if (leaves.empty()) return make_state_dict();
  std::vector<const Leaf*> all;
  for (const auto& leaf : leaves) all.push_back(&leaf);
  c10::IValue root = build(all, 0);
  LF_CHECK(root.isGenericDict(), RuntimeError, "torch.distributed.checkpoint: the checkpoint's top level is a list.");
  return root.toGenericDict();
}

Metadata write_rank_items(const fs::path& folder, const std::string& file, const std::vector<SaveItem>& items) {
  Metadata metadata;
  if (items.empty()) return metadata;
  write_file_atomically(folder / file, [&](const ByteSink& sink) {
    uint64_t written = 0;
    auto put = [&](const c10::IValue& value) {  // streamed: no archive is held in memory whole
      const uint64_t start = written;
      stream_archive(value, [&](const void* data, size_t size) {
        sink(data, size);
        written += size;
      });
      return Location{file, start, written - start};
    };
    for (const SaveItem& save : items) {
      const std::string key = flat_key(save.path);
      LF_CHECK(metadata.items.find(key) == metadata.items.end(), ValueError, "fabric.save: two entries flatten to the key ",
               key, " (torch.distributed.checkpoint joins the path with \".\"); rename one of them.");
      Item item;
      item.path = save.path;
      if (!save.value.isTensor()) {
        item.locations.push_back(put(save.value));
        metadata.add(key, std::move(item));
        continue;
      }
      const at::Tensor tensor = save.value.toTensor().detach().cpu();
      item.kind = Item::Kind::Tensor;
      item.dtype = c10::toString(tensor.scalar_type());
      const Placement placement = save.placement.value_or(Placement::whole(tensor.sizes().vec()));
      item.size = placement.global_shape;
      item.chunks = placement.boxes();
      const at::Tensor flat = tensor.reshape(-1);
      int64_t at = 0;
      for (const Box& box : item.chunks) {
        // torch.save writes a view's whole storage: a box that is less than its storage is cloned.
        at::Tensor part = flat.narrow(0, at, box.numel()).reshape(box.sizes);
        if (!covers_its_storage(part)) part = part.clone();
        item.locations.push_back(put(part));
        at += box.numel();
      }
      metadata.add(key, std::move(item));
    }
  });
  return metadata;
}

Metadata merge_metadata(const std::vector<Metadata>& parts) {
  Metadata merged;
  for (const Metadata& part : parts) {
    for (const std::string& key : part.order) {
      const Item& item = part.items.at(key);
      auto found = merged.items.find(key);
      if (found == merged.items.end()) {
        merged.add(key, item);
      } else if (item.kind == Item::Kind::Tensor) {
        Item& into = found->second;
        into.chunks.insert(into.chunks.end(), item.chunks.begin(), item.chunks.end());
        into.locations.insert(into.locations.end(), item.locations.begin(), item.locations.end());
      }
    }
  }
  return merged;
}

FolderReader::FolderReader(fs::path folder) : folder_(std::move(folder)), metadata_(read_metadata(folder_)) {}
FolderReader::~FolderReader() = default;

std::string_view FolderReader::bytes_of(const Location& location, const std::string& key) {
  auto found = files_.find(location.file);
  if (found == files_.end()) {
    const fs::path path = folder_ / location.file;
    LF_CHECK(fs::is_regular_file(path), RuntimeError, "Checkpoint ", folder_.string(), " is incomplete: ",
             location.file, " (holding ", key, ") is missing.");
    found = files_.emplace(location.file, std::make_unique<zip::MappedFile>(path)).first;
  }
  const std::string_view bytes = found->second->bytes();
  LF_CHECK(location.offset + location.length <= bytes.size(), RuntimeError, "Checkpoint ", folder_.string(), ": ",
           location.file, " is truncated: ", key, " needs bytes up to ", location.offset + location.length,
           ", the file has ", bytes.size(), ".");
  return bytes.substr(location.offset, location.length);
}

at::Tensor FolderReader::chunk(const std::string& key, const Item& item, size_t index) {
  const std::string what = "Checkpoint " + (folder_ / item.locations[index].file).string() + " (" + key + ")";
  const c10::IValue value = value_of_archive(bytes_of(item.locations[index], key), what);
  LF_CHECK(value.isTensor() && value.toTensor().sizes().vec() == item.chunks[index].sizes, RuntimeError, what,
           " does not hold a tensor of the chunk's shape ", c10::IntArrayRef(item.chunks[index].sizes), ".");
  return value.toTensor();
}

c10::IValue FolderReader::value(const std::string& key) {
  auto found = metadata_.items.find(key);
  LF_CHECK(found != metadata_.items.end(), RuntimeError, "Checkpoint ", folder_.string(), " has no entry ", key, ".");
  const Item& item = found->second;
  if (item.kind == Item::Kind::Bytes) {
    return value_of_archive(bytes_of(item.locations[0], key),
                            "Checkpoint " + (folder_ / item.locations[0].file).string() + " (" + key + ")");
  }
  return part(key, Placement::whole(item.size));
}

at::Tensor FolderReader::flat_range(const std::string& key, int64_t begin, int64_t length) {
  auto found = metadata_.items.find(key);
  LF_CHECK(found != metadata_.items.end(), RuntimeError, "Checkpoint ", folder_.string(), " has no entry ", key, ".");
  Placement range = Placement::whole(found->second.size);
  range.flat = ShardSlice{begin, length};
  return part(key, range);
}

at::Tensor FolderReader::part(const std::string& key, const Placement& wanted) {
  auto found = metadata_.items.find(key);
  LF_CHECK(found != metadata_.items.end(), RuntimeError, "Checkpoint ", folder_.string(), " has no entry ", key, ".");
  const Item& item = found->second;
  const std::vector<Box> boxes = wanted.boxes();
  int64_t length = 0;
  for (const Box& box : boxes) length += box.numel();
  at::Tensor out;  // flat, in the value's order
  int64_t covered = 0;
  for (size_t c = 0; c < item.chunks.size(); ++c) {
    at::Tensor saved;
    int64_t at = 0;
    for (const Box& box : boxes) {
      if (auto common = intersect(box, item.chunks[c])) {
        if (!saved.defined()) saved = chunk(key, item, c);
        if (!out.defined()) out = torch::empty({length}, saved.options());
        at::Tensor target = out.narrow(0, at, box.numel()).view(box.sizes);
        sub_box(target, *common, box).copy_(sub_box(saved, *common, item.chunks[c]));
        covered += common->numel();
      }
      at += box.numel();
    }
  }
  const std::string range = wanted.flat ? " (elements " + std::to_string(wanted.flat->begin) + " to " +
                                              std::to_string(wanted.flat->begin + wanted.flat->length) + " of"
                                        : " (";
  LF_CHECK(covered == length, RuntimeError, "Checkpoint ", folder_.string(), ": the saved chunks of ", key, " cover ",
           covered, " of the ", length, " elements wanted", range, " the box at ", c10::IntArrayRef(wanted.box.offsets),
           " of size ", c10::IntArrayRef(wanted.box.sizes), "); the checkpoint is incomplete.");
  if (!out.defined()) out = torch::empty({length}, scalar_type_of(item.dtype));
  return out.view(wanted.local_shape());
}

bool is_optimizer_field(const std::vector<PathElement>& path, const char* section) {
  return path.size() >= 3 && path[1].index < 0 && path[1].key == section;
}

void name_optimizer_leaf(Leaf& leaf, const std::vector<std::string>& names) {
  auto name_of = [&](int64_t index) {
    return index >= 0 && index < static_cast<int64_t>(names.size()) ? names[static_cast<size_t>(index)] : std::to_string(index);
  };
  if (is_optimizer_field(leaf.path, "state") && leaf.path.size() == 4) {
    leaf.path[2].key = name_of(std::stoll(leaf.path[2].key));
    if (leaf.path[3].key == "step" && (leaf.value.isInt() || leaf.value.isDouble())) {
      leaf.value = torch::scalar_tensor(leaf.value.isInt() ? static_cast<double>(leaf.value.toInt()) : leaf.value.toDouble(),
                                        torch::kFloat32);
    }
  } else if (is_optimizer_field(leaf.path, "param_groups") && leaf.path.size() == 4 && leaf.path[3].key == "params") {
    c10::impl::GenericList named(c10::StringType::get());
    for (const c10::IValue index : leaf.value.toList()) named.push_back(name_of(index.toInt()));
    leaf.value = named;
  }
}

namespace {
std::vector<std::pair<const char*, c10::IValue>> python_group_defaults(const torch::optim::Optimizer& optimizer) {
  std::vector<std::pair<const char*, c10::IValue>> defaults = {
      {"maximize", false}, {"foreach", c10::IValue()}, {"differentiable", false}};
  const bool adam = dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr;
  const bool adamw = dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr;
  const bool rmsprop = dynamic_cast<const torch::optim::RMSprop*>(&optimizer) != nullptr;
  if (!rmsprop) defaults.emplace_back("fused", c10::IValue());
  if (adam || adamw || rmsprop) defaults.emplace_back("capturable", false);
  if (adam || adamw) defaults.emplace_back("decoupled_weight_decay", adamw);
  return defaults;
}
}  // namespace

void add_python_group_defaults(StateDict& optimizer_dict, const torch::optim::Optimizer& optimizer) {
  if (!optimizer_dict.contains("param_groups")) return;
  for (const c10::IValue group : optimizer_dict.at("param_groups").toList()) {
    auto dict = group.toGenericDict();
    for (const auto& [name, value] : python_group_defaults(optimizer)) {
      if (!dict.contains(name)) dict.insert(name, value);
    }
  }
}

std::vector<SaveItem> collect_save_items(const State& state, const StateDict& local, const SaveRules& rules,
                                         StateDict& rest) {
  std::vector<SaveItem> items;
  for (const auto& [key, entry] : state) {
    if (!local.contains(key)) continue;
    if (entry.module() == nullptr && entry.optimizer() == nullptr) {
      rest.insert(key, local.at(key));
      continue;
    }
    StateDict one = make_state_dict();
    one.insert(key, local.at(key));
    std::vector<std::string> names;
    if (entry.optimizer() != nullptr) {
      names = rules.parameter_names(*entry.optimizer());
      if (local.at(key).isGenericDict()) {
        StateDict optimizer_dict = local.at(key).toGenericDict();  // shares the dict: `one` gains the defaults
        add_python_group_defaults(optimizer_dict, *entry.optimizer());
      }
    }
    for (Leaf& leaf : flatten_state(one)) {
      SaveItem item{leaf.path, leaf.value, rules.place(slash_path(leaf.path))};  // before names replace indices
      if (!(item.placement ? item.placement->writes : rules.writes_whole)) continue;
      if (entry.optimizer() != nullptr) {
        name_optimizer_leaf(leaf, names);
        const auto listed = rules.group_params.find(key);
        if (listed != rules.group_params.end() && is_optimizer_field(leaf.path, "param_groups") && leaf.path.size() == 4 &&
            leaf.path[3].key == "params" && leaf.path[2].index >= 0 &&
            leaf.path[2].index < static_cast<int64_t>(listed->second.size())) {
          c10::impl::GenericList every_rank(c10::StringType::get());
          for (const std::string& name : listed->second[static_cast<size_t>(leaf.path[2].index)]) every_rank.push_back(name);
          leaf.value = every_rank;
        }
        item.path = leaf.path;
        item.value = leaf.value;
      }
      items.push_back(std::move(item));
    }
  }
  return items;
}

}  // namespace lightning::fabric::dcp
