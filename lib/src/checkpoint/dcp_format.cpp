#include "lightning/fabric/checkpoint/dcp_format.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "lightning/fabric/checkpoint/pickle_tree.h"
#include "lightning/fabric/checkpoint/zip_archive.h"
#include "lightning/fabric/errors.h"

namespace lightning::fabric::dcp {

namespace fs = std::filesystem;
using pickle::Node;
using pickle::NodePtr;
using Kind = pickle::Node::Kind;

namespace {
constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";

struct DtypeName {
  const char* c10;
  const char* torch;
  int size;
};
constexpr DtypeName kDtypes[] = {
    {"Float", "float32", 4}, {"Double", "float64", 8}, {"Half", "float16", 2}, {"BFloat16", "bfloat16", 2},
    {"Long", "int64", 8},    {"Int", "int32", 4},      {"Short", "int16", 2},  {"Char", "int8", 1},
    {"Byte", "uint8", 1},    {"Bool", "bool", 1}};

// [begin, end) of the flattened sub-tensor shape[dim:], which sits at `prefix` in the dims before.
void decompose(const std::vector<int64_t>& shape, size_t dim, std::vector<int64_t> prefix, int64_t begin, int64_t end,
               std::vector<Box>& out) {
  if (begin >= end) return;
  const size_t dims = shape.size();
  auto box = [&](int64_t first, int64_t count) {
    Box b;
    b.offsets = prefix;
    b.sizes.assign(prefix.size(), 1);
    b.offsets.push_back(first);
    b.sizes.push_back(count);
    for (size_t d = dim + 1; d < dims; ++d) {
      b.offsets.push_back(0);
      b.sizes.push_back(shape[d]);
    }
    out.push_back(std::move(b));
  };
  if (dim + 1 == dims) return box(begin, end - begin);
  int64_t row = 1;
  for (size_t d = dim + 1; d < dims; ++d) row *= shape[d];
  const int64_t first_full = (begin + row - 1) / row, last_full = end / row;
  auto within_row = [&](int64_t r, int64_t from, int64_t to) {
    std::vector<int64_t> deeper = prefix;
    deeper.push_back(r);
    decompose(shape, dim + 1, std::move(deeper), from, to, out);
  };
  if (first_full > last_full) return within_row(begin / row, begin % row, end - (begin / row) * row);
  if (begin % row != 0) within_row(begin / row, begin % row, row);
  if (last_full > first_full) box(first_full, last_full - first_full);
  if (end % row != 0) within_row(last_full, 0, end % row);
}

// --- reading the pickle's objects --------------------------------------------------------------

[[noreturn]] void bad(const std::string& what, const std::string& detail) {
  throw RuntimeError(what + " is not a torch.distributed.checkpoint metadata file: " + detail + ".");
}

// The class of an object node: NEWOBJ's class, a REDUCE callable, seen through BUILD.
const Node* object_class(const NodePtr& node) {
  if (!node) return nullptr;
  if (node->kind == Kind::Build) return object_class(node->items[0]);
  if (node->kind == Kind::NewObj || node->kind == Kind::Reduce) {
    const NodePtr& callable = node->items[0];
    if (pickle::is_global(callable, "copyreg", "__newobj__") && !node->items[1]->items.empty()) {
      return node->items[1]->items[0].get();
    }
    return callable->kind == Kind::Global ? callable.get() : nullptr;
  }
  return nullptr;
}

bool is_class(const NodePtr& node, std::string_view name) {
  const Node* cls = object_class(node);
  return cls != nullptr && cls->name == name;
}

// A dataclass field: BUILD's dict state.
NodePtr field(const NodePtr& object, const std::string& name) {
  if (!object || object->kind != Kind::Build) return nullptr;
  const NodePtr& state = object->items[1];
  Node* dict = pickle::as_dict(state);
  if (dict == nullptr) {
    // (None, {slots}) state
    if (state->kind == Kind::Tuple && state->items.size() == 2) dict = pickle::as_dict(state->items[1]);
    if (dict == nullptr) return nullptr;
  }
  NodePtr* found = pickle::dict_find(*dict, name);
  return found ? *found : nullptr;
}

// A torch.Size (REDUCE of torch.Size over a tuple) or a plain tuple of ints.
std::vector<int64_t> int_sequence(const NodePtr& node, const std::string& what, const std::string& field_name) {
  NodePtr values = node;
  if (values && values->kind == Kind::Reduce && pickle::is_global(values->items[0], "torch", "Size")) {
    values = values->items[1]->items.empty() ? nullptr : values->items[1]->items[0];
  }
  if (!values || (values->kind != Kind::Tuple && values->kind != Kind::List)) bad(what, field_name + " is not a size");
  std::vector<int64_t> out;
  for (const auto& item : values->items) {
    if (item->kind != Kind::Int) bad(what, field_name + " holds a value that is not an integer");
    out.push_back(item->integer);
  }
  return out;
}

Item tensor_item(const NodePtr& node, const std::string& key, const std::string& what) {
  Item item;
  item.kind = Item::Kind::Tensor;
  NodePtr properties = field(node, "properties");
  // TensorProperties pickles its state as (dtype, layout, requires_grad, memory format, pin_memory).
  NodePtr state = properties && properties->kind == Kind::Build ? properties->items[1] : nullptr;
  if (!state || state->kind != Kind::Tuple || state->items.size() < 3 || state->items[0]->kind != Kind::Global) {
    bad(what, "the properties of " + key + " are not TensorProperties");
  }
  item.dtype = c10_dtype_name(state->items[0]->name);
  if (item.dtype.empty()) bad(what, key + " has dtype torch." + state->items[0]->name + ", which is not supported here");
  item.requires_grad = state->items[2]->kind == Kind::Bool && state->items[2]->boolean;
  item.size = int_sequence(field(node, "size"), what, key + "'s size");
  NodePtr chunks = field(node, "chunks");
  if (!chunks || chunks->kind != Kind::List) bad(what, key + " has no list of chunks");
  for (const auto& chunk : chunks->items) {
    item.chunks.push_back({int_sequence(field(chunk, "offsets"), what, key + "'s chunk offsets"),
                           int_sequence(field(chunk, "sizes"), what, key + "'s chunk sizes")});
    if (item.chunks.back().offsets.size() != item.size.size() || item.chunks.back().sizes.size() != item.size.size()) {
      bad(what, "a chunk of " + key + " has another number of dimensions than the tensor");
    }
  }
  item.locations.resize(item.chunks.size());
  return item;
}

std::vector<PathElement> path_of(const NodePtr& node, const std::string& what) {
  if (!node || (node->kind != Kind::Tuple && node->kind != Kind::List)) bad(what, "planner_data holds a path that is not a tuple");
  std::vector<PathElement> path;
  for (const auto& element : node->items) {
    if (element->kind == Kind::String) {
      path.push_back({element->text, -1});
    } else if (element->kind == Kind::Int) {
      path.push_back({"", element->integer});
    } else {
      bad(what, "planner_data holds a path element that is neither a string nor an integer");
    }
  }
  return path;
}

// --- writing --------------------------------------------------------------------------------

NodePtr size_node(const std::vector<int64_t>& values) {
  std::vector<NodePtr> items;
  for (int64_t value : values) items.push_back(pickle::make_int(value));
  return pickle::make_reduce(pickle::make_global("torch", "Size"), pickle::make_tuple({pickle::make_tuple(std::move(items))}));
}

NodePtr dict_node(std::vector<std::pair<std::string, NodePtr>> fields) {
  auto dict = pickle::make_node(Kind::Dict);
  for (auto& [name, value] : fields) {
    dict->items.push_back(pickle::make_string(name));
    dict->items.push_back(std::move(value));
  }
  return dict;
}

NodePtr dataclass(const std::string& module, const std::string& name, std::vector<std::pair<std::string, NodePtr>> fields) {
  return pickle::make_object(pickle::make_global(module, name), pickle::make_tuple({}), dict_node(std::move(fields)));
}

NodePtr tensor_metadata(const Item& item) {
  const std::string dtype = torch_dtype_name(item.dtype);
  LF_CHECK(!dtype.empty(), ValueError, "torch.distributed.checkpoint: dtype ", item.dtype, " has no torch name.");
  auto memory_format = pickle::make_reduce(pickle::make_global(kMetadataModule, "_MEM_FORMAT_ENCODING"),
                                           pickle::make_tuple({pickle::make_int(0)}));  // contiguous
  auto properties = pickle::make_object(
      pickle::make_global(kMetadataModule, "TensorProperties"), pickle::make_tuple({}),
      pickle::make_tuple({pickle::make_global("torch", dtype), pickle::make_global("torch", "strided"),
                          pickle::make_bool(item.requires_grad), memory_format, pickle::make_bool(false)}));
  auto chunks = pickle::make_node(Kind::List);
  for (const Box& box : item.chunks) {
    chunks->items.push_back(
        dataclass(kMetadataModule, "ChunkStorageMetadata", {{"offsets", size_node(box.offsets)}, {"sizes", size_node(box.sizes)}}));
  }
  return dataclass(kMetadataModule, "TensorStorageMetadata",
                   {{"properties", properties}, {"size", size_node(item.size)}, {"chunks", chunks}});
}

NodePtr storage_index(const std::string& key, const Box* box, int64_t index) {
  return dataclass(kMetadataModule, "MetadataIndex",
                   {{"fqn", pickle::make_string(key)},
                    {"offset", box ? size_node(box->offsets) : pickle::make_node(Kind::None)},
                    {"index", box ? pickle::make_int(index) : pickle::make_node(Kind::None)}});
}

NodePtr storage_info(const Location& location) {
  return dataclass("torch.distributed.checkpoint.filesystem", "_StorageInfo",
                   {{"relative_path", pickle::make_string(location.file)},
                    {"offset", pickle::make_int(static_cast<int64_t>(location.offset))},
                    {"length", pickle::make_int(static_cast<int64_t>(location.length))},
                    {"transform_descriptors", pickle::make_node(Kind::None)}});
}

NodePtr path_node(const std::vector<PathElement>& path) {
  std::vector<NodePtr> items;
  for (const auto& element : path) items.push_back(element.index >= 0 ? pickle::make_int(element.index) : pickle::make_string(element.key));
  return pickle::make_tuple(std::move(items));
}
}  // namespace

int64_t Box::numel() const {
  int64_t count = 1;
  for (int64_t size : sizes) count *= size;
  return count;
}

std::vector<Box> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t length) {
  std::vector<Box> out;
  if (length <= 0) return out;
  if (shape.empty()) return {Box{}};
  decompose(shape, 0, {}, begin, begin + length, out);
  return out;
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  Box common;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t begin = std::max(a.offsets[d], b.offsets[d]);
    const int64_t end = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (end <= begin) return std::nullopt;
    common.offsets.push_back(begin);
    common.sizes.push_back(end - begin);
  }
  return common;
}

std::vector<int64_t> relative_offsets(const Box& inner, const Box& outer) {
  std::vector<int64_t> out;
  for (size_t d = 0; d < inner.offsets.size(); ++d) out.push_back(inner.offsets[d] - outer.offsets[d]);
  return out;
}

void Metadata::add(const std::string& key, Item item) {
  if (items.find(key) == items.end()) order.push_back(key);
  items[key] = std::move(item);
}

std::string data_file_name(int rank) { return "__" + std::to_string(rank) + "_0.distcp"; }

std::string join_path(const std::vector<PathElement>& path, char separator) {
  std::string joined;
  for (const auto& element : path) {
    if (!joined.empty()) joined += separator;
    joined += element.index >= 0 ? std::to_string(element.index) : element.key;
  }
  return joined;
}

std::string torch_dtype_name(const std::string& c10_name) {
  for (const auto& dtype : kDtypes) {
    if (c10_name == dtype.c10) return dtype.torch;
  }
  return {};
}

std::string c10_dtype_name(const std::string& torch_name) {
  for (const auto& dtype : kDtypes) {
    if (torch_name == dtype.torch) return dtype.c10;
  }
  return {};
}

int dtype_size(const std::string& c10_name) {
  for (const auto& dtype : kDtypes) {
    if (c10_name == dtype.c10) return dtype.size;
  }
  return 0;
}

std::string write_metadata(const Metadata& metadata) {
  auto state_dict_metadata = pickle::make_node(Kind::Dict);
  auto planner_data = pickle::make_node(Kind::Dict);
  auto storage_data = pickle::make_node(Kind::Dict);
  for (const std::string& key : metadata.order) {
    const Item& item = metadata.items.at(key);
    state_dict_metadata->items.push_back(pickle::make_string(key));
    state_dict_metadata->items.push_back(item.kind == Item::Kind::Tensor
                                             ? tensor_metadata(item)
                                             : dataclass(kMetadataModule, "BytesStorageMetadata", {}));
    planner_data->items.push_back(pickle::make_string(key));
    planner_data->items.push_back(path_node(item.path.empty() ? std::vector<PathElement>{{key, -1}} : item.path));
    for (size_t i = 0; i < item.locations.size(); ++i) {
      const bool tensor = item.kind == Item::Kind::Tensor;
      storage_data->items.push_back(storage_index(key, tensor ? &item.chunks[i] : nullptr, static_cast<int64_t>(i)));
      storage_data->items.push_back(storage_info(item.locations[i]));
    }
  }
  auto root = dataclass(kMetadataModule, "Metadata",
                        {{"state_dict_metadata", state_dict_metadata},
                         {"planner_data", planner_data},
                         {"storage_data", storage_data},
                         {"storage_meta", pickle::make_node(Kind::None)},
                         {"version", pickle::make_string("1.0.0")}});
  return pickle::write(*root);
}

Metadata parse_metadata(std::string_view bytes, const std::string& what) {
  const NodePtr root = pickle::parse(bytes, what);
  if (!is_class(root, "Metadata")) bad(what, "its pickle is not a Metadata object");
  Metadata metadata;
  NodePtr state_dict_metadata = field(root, "state_dict_metadata");
  Node* entries = pickle::as_dict(state_dict_metadata);
  if (entries == nullptr) bad(what, "it has no state_dict_metadata");
  for (size_t i = 0; i + 1 < entries->items.size(); i += 2) {
    if (entries->items[i]->kind != Kind::String) bad(what, "a key of state_dict_metadata is not a string");
    const std::string& key = entries->items[i]->text;
    const NodePtr& value = entries->items[i + 1];
    if (is_class(value, "TensorStorageMetadata")) {
      metadata.add(key, tensor_item(value, key, what));
    } else if (is_class(value, "BytesStorageMetadata")) {
      Item item;
      item.locations.resize(1);
      metadata.add(key, std::move(item));
    } else {
      bad(what, key + " is neither a tensor nor bytes");
    }
  }
  if (Node* planner = pickle::as_dict(field(root, "planner_data"))) {
    for (size_t i = 0; i + 1 < planner->items.size(); i += 2) {
      auto found = metadata.items.find(planner->items[i]->text);
      if (found != metadata.items.end()) found->second.path = path_of(planner->items[i + 1], what);
    }
  }
  Node* storage = pickle::as_dict(field(root, "storage_data"));
  if (storage == nullptr) bad(what, "it has no storage_data");
  for (size_t i = 0; i + 1 < storage->items.size(); i += 2) {
    const NodePtr& index = storage->items[i];
    const NodePtr& info = storage->items[i + 1];
    NodePtr fqn = field(index, "fqn");
    if (!fqn || fqn->kind != Kind::String) bad(what, "a storage_data key has no fqn");
    auto found = metadata.items.find(fqn->text);
    if (found == metadata.items.end()) bad(what, "storage_data names " + fqn->text + ", which state_dict_metadata lacks");
    Item& item = found->second;
    NodePtr path = field(info, "relative_path"), offset = field(info, "offset"), length = field(info, "length");
    if (!path || path->kind != Kind::String || !offset || offset->kind != Kind::Int || !length || length->kind != Kind::Int) {
      bad(what, "the storage of " + fqn->text + " is not a _StorageInfo");
    }
    NodePtr descriptors = field(info, "transform_descriptors");
    if (descriptors && descriptors->kind == Kind::List && !descriptors->items.empty()) {
      bad(what, "the storage of " + fqn->text + " is transformed (compressed or encrypted), which is not supported here");
    }
    const Location location{path->text, static_cast<uint64_t>(offset->integer), static_cast<uint64_t>(length->integer)};
    if (item.kind == Item::Kind::Bytes) {
      item.locations[0] = location;
      continue;
    }
    const std::vector<int64_t> chunk_offset = int_sequence(field(index, "offset"), what, fqn->text + "'s storage offset");
    size_t slot = 0;
    while (slot < item.chunks.size() && item.chunks[slot].offsets != chunk_offset) ++slot;
    if (slot == item.chunks.size()) bad(what, "storage_data names a chunk of " + fqn->text + " that state_dict_metadata lacks");
    item.locations[slot] = location;
  }
  for (const auto& [key, item] : metadata.items) {
    for (const auto& location : item.locations) {
      if (location.file.empty()) bad(what, "no storage is recorded for " + key);
    }
  }
  return metadata;
}

Metadata read_metadata(const fs::path& folder) {
  LF_CHECK(fs::exists(folder), RuntimeError, "Checkpoint ", folder.string(), " does not exist. Check the path.");
  LF_CHECK(fs::is_directory(folder), RuntimeError, "Checkpoint ", folder.string(), " is a file, not a sharded checkpoint folder.");
  const fs::path file = folder / kMetadataFile;
  LF_CHECK(fs::is_regular_file(file), RuntimeError, "Checkpoint folder ", folder.string(),
           " has no .metadata: it is not a torch.distributed.checkpoint folder, or its save did not finish.");
  std::ifstream in(file, std::ios::binary);
  std::stringstream content;
  content << in.rdbuf();
  return parse_metadata(content.str(), "Checkpoint " + file.string());
}

bool is_dcp_checkpoint(const fs::path& folder) { return fs::is_regular_file(folder / kMetadataFile); }

}  // namespace lightning::fabric::dcp
