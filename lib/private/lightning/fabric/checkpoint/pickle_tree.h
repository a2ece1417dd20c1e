// The data.pkl of a torch.save archive as a tree of plain nodes, read and written without
// LibTorch: enough of Python's pickle protocol for what LibTorch's pickler emits (dicts tagged
// with their type, lists, tuples, scalars, strings, tensors as _rebuild_tensor_v2 calls over a
// persistent storage id). `lightning-run model consolidate` edits checkpoints with it. The
// memo is resolved while reading (a repeated object becomes a shared node) and not written
// back: the output repeats such objects, which every unpickler reads as equal values.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lightning::fabric::pickle {

struct Node;
using NodePtr = std::shared_ptr<Node>;

struct Node {
  enum class Kind { None, Bool, Int, Float, String, Bytes, Tuple, List, Dict, Global, Reduce, NewObj, PersistentId, Build };
  Kind kind = Kind::None;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0.0;
  std::string text;            // String, Bytes; Global: "module" and name below
  std::string name;            // Global; Dict: "OrderedDict" for collections.OrderedDict()
  std::vector<NodePtr> items;  // Tuple, List; Dict: key, value, key, value...; Reduce: callable, args;
                               // NewObj: class, args; PersistentId: the id; Build: object, state
};

NodePtr make_node(Node::Kind kind);
NodePtr make_string(std::string text);
NodePtr make_float(double value);
NodePtr make_bool(bool value);
NodePtr make_global(const std::string& module, const std::string& name);
NodePtr make_reduce(NodePtr callable, NodePtr args);
/// cls.__new__(cls, *args) (NEWOBJ), then, with state, BUILD (__setstate__ or __dict__ update).
NodePtr make_object(NodePtr cls, NodePtr args, NodePtr state);
bool is_global(const NodePtr& node, std::string_view module, std::string_view name);
NodePtr make_int(int64_t value);
NodePtr make_tuple(std::vector<NodePtr> items);

/// The tree of a pickle. RuntimeError naming `what` for an opcode outside the supported set or
/// a malformed stream.
NodePtr parse(std::string_view bytes, const std::string& what);
/// Protocol-2 pickle of the tree.
std::string write(const Node& root);
/// The tree as LibTorch's unpickler reads it: Python's OrderedDicts (state dicts) become plain
/// dicts and their attributes (BUILD of `_metadata`) are dropped; tensors are left as they are.
/// LibTorch would read an OrderedDict as None. Returns new nodes where it changed something.
NodePtr plain_dicts(const NodePtr& node);

/// The dict node itself, seeing through LibTorch's restore_type_tag(dict, type) wrapper;
/// nullptr for anything else.
Node* as_dict(const NodePtr& node);
/// The value under a dict key given as text: a string key equal to it, or an integer key whose
/// decimal form equals it. nullptr when there is none.
NodePtr* dict_find(Node& dict, const std::string& key);

/// A tensor as torch.save writes it: storage record `key` of storage_numel elements, viewed at
/// offset with sizes and strides.
struct TensorRecord {
  std::string storage_type;  // "FloatStorage", "LongStorage", ...
  std::string key;
  std::string location = "cpu";
  int64_t storage_numel = 0;
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
};
/// The record of a _rebuild_tensor_v2 call node, or nullopt for anything else.
std::optional<TensorRecord> as_tensor(const Node& node);
/// A contiguous tensor node over its record (requires_grad false, no hooks).
NodePtr make_tensor(const TensorRecord& tensor);
/// Points a tensor node at another storage key (renumbering records when writing an archive).
void set_tensor_key(Node& tensor, const std::string& key);
/// Bytes per element of a storage type ("FloatStorage": 4); 0 for an unknown type.
int element_size(const std::string& storage_type);
/// Storage type of a dtype as metadata.json names it ("Float" -> "FloatStorage").
std::string storage_type_of(const std::string& dtype);

}  // namespace lightning::fabric::pickle
