#include "lightning/fabric/checkpoint/pickle_tree.h"

#include <cstring>
#include <map>

#include "lightning/fabric/checkpoint/file_bytes.h"
#include "lightning/fabric/errors.h"

namespace lightning::fabric::pickle {

using Kind = Node::Kind;

NodePtr make_node(Kind kind) {
  auto node = std::make_shared<Node>();
  node->kind = kind;
  return node;
}

NodePtr make_global(const std::string& module, const std::string& name) {
  auto node = make_node(Kind::Global);
  node->text = module;
  node->name = name;
  return node;
}

NodePtr make_reduce(NodePtr callable, NodePtr args) {
  auto node = make_node(Kind::Reduce);
  node->items = {std::move(callable), std::move(args)};
  return node;
}

NodePtr make_object(NodePtr cls, NodePtr args, NodePtr state) {
  auto object = make_node(Kind::NewObj);
  object->items = {std::move(cls), std::move(args)};
  if (!state) return object;
  auto build = make_node(Kind::Build);
  build->items = {std::move(object), std::move(state)};
  return build;
}

bool is_global(const NodePtr& node, std::string_view module, std::string_view name) {
  return node && node->kind == Kind::Global && node->text == module && node->name == name;
}

namespace {
NodePtr make(Kind kind) { return make_node(kind); }

// Reads one pickle stream; the opcodes are those of Python's pickle module.
class Parser {
 public:
  Parser(std::string_view bytes, const std::string& what) : bytes_(bytes), what_(what) {}

  NodePtr run() {
    while (true) {
      const auto opcode = static_cast<unsigned char>(take(1)[0]);
      if (opcode == '.') break;
      step(opcode);
    }
    if (stack_.size() != 1) fail("the stream ends with " + std::to_string(stack_.size()) + " values instead of one");
    return stack_.back();
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw RuntimeError("The pickle in " + what_ + " cannot be read: " + why + " (at byte " + std::to_string(at_) + ").");
  }
  std::string_view take(size_t count) {
    if (at_ + count > bytes_.size()) fail("it ends early");
    const std::string_view out = bytes_.substr(at_, count);
    at_ += count;
    return out;
  }
  uint64_t take_le(int width) {
    return internal::read_le(take(static_cast<size_t>(width)), 0, width);
  }
  std::string take_line() {
    const size_t end = bytes_.find('\n', at_);
    if (end == std::string_view::npos) fail("a GLOBAL without its line end");
    std::string line(bytes_.substr(at_, end - at_));
    at_ = end + 1;
    return line;
  }
  NodePtr pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("the stack is empty");
    NodePtr node = std::move(stack_.back());
    stack_.pop_back();
    return node;
  }
  std::vector<NodePtr> pop_to_mark() {
    if (marks_.empty()) fail("no MARK");
    std::vector<NodePtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  Node& top(Kind kind) {
    if (stack_.empty() || stack_.back()->kind != kind) fail("an item added to something that is not a list or dict");
    return *stack_.back();
  }
  template <typename Setter>
  void push_scalar(Kind kind, Setter setter) {
    NodePtr node = make(kind);
    setter(*node);
    stack_.push_back(std::move(node));
  }
  void push_text(Kind kind, size_t length) {
    const std::string_view text = take(length);
    push_scalar(kind, [&](Node& n) { n.text = std::string(text); });
  }
  void push_tuple(std::vector<NodePtr> items) { stack_.push_back(make_tuple(std::move(items))); }

  void step(unsigned char opcode) {
    switch (opcode) {
      case 0x80: take(1); break;  // PROTO
      case 0x95: take(8); break;  // FRAME
      case 'N': stack_.push_back(make(Kind::None)); break;
      case 0x88: case 0x89: push_scalar(Kind::Bool, [&](Node& n) { n.boolean = opcode == 0x88; }); break;
      case 'K': push_scalar(Kind::Int, [&](Node& n) { n.integer = static_cast<int64_t>(take_le(1)); }); break;
      case 'M': push_scalar(Kind::Int, [&](Node& n) { n.integer = static_cast<int64_t>(take_le(2)); }); break;
      case 'J': push_scalar(Kind::Int, [&](Node& n) { n.integer = static_cast<int32_t>(take_le(4)); }); break;
      case 0x8a: {  // LONG1: little-endian two's complement of n bytes
        const auto length = static_cast<int>(take_le(1));
        if (length > 8) fail("an integer wider than 64 bits");
        uint64_t raw = length > 0 ? take_le(length) : 0;
        if (length > 0 && length < 8 && (raw >> (8 * length - 1)) & 1) raw |= ~uint64_t{0} << (8 * length);
        push_scalar(Kind::Int, [&](Node& n) { n.integer = static_cast<int64_t>(raw); });
        break;
      }
      case 'G': {  // BINFLOAT: big-endian double
        const std::string_view raw = take(8);
        uint64_t bits = 0;
        for (char c : raw) bits = (bits << 8) | static_cast<unsigned char>(c);
        push_scalar(Kind::Float, [&](Node& n) { std::memcpy(&n.real, &bits, sizeof bits); });
        break;
      }
      case 'X': push_text(Kind::String, take_le(4)); break;
      case 0x8c: push_text(Kind::String, take_le(1)); break;
      case 0x8d: push_text(Kind::String, take_le(8)); break;
      case 'B': push_text(Kind::Bytes, take_le(4)); break;
      case 'C': push_text(Kind::Bytes, take_le(1)); break;
      case 'c': {
        std::string module = take_line();
        stack_.push_back(make_global(module, take_line()));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        NodePtr name = pop(), module = pop();
        stack_.push_back(make_global(module->text, name->text));
        break;
      }
      case 'q': memo_[take_le(1)] = stack_.empty() ? nullptr : stack_.back(); break;
      case 'r': memo_[take_le(4)] = stack_.empty() ? nullptr : stack_.back(); break;
      case 0x94: memo_[memo_.size()] = stack_.empty() ? nullptr : stack_.back(); break;
      case 'h': case 'j': {
        auto found = memo_.find(take_le(opcode == 'h' ? 1 : 4));
        if (found == memo_.end() || !found->second) fail("a memo reference to nothing");
        stack_.push_back(found->second);
        break;
      }
      case '(': marks_.push_back(stack_.size()); break;
      case ')': push_tuple({}); break;
      case 't': push_tuple(pop_to_mark()); break;
      case 0x85: case 0x86: case 0x87: {
        std::vector<NodePtr> items(static_cast<size_t>(opcode - 0x84));
        for (auto it = items.rbegin(); it != items.rend(); ++it) *it = pop();
        push_tuple(std::move(items));
        break;
      }
      case ']': stack_.push_back(make(Kind::List)); break;
      case '}': stack_.push_back(make(Kind::Dict)); break;
      case 'a': {
        NodePtr value = pop();
        top(Kind::List).items.push_back(std::move(value));
        break;
      }
      case 'e': {
        auto items = pop_to_mark();
        auto& list = top(Kind::List).items;
        list.insert(list.end(), items.begin(), items.end());
        break;
      }
      case 's': {
        NodePtr value = pop(), key = pop();
        auto& dict = top(Kind::Dict).items;
        dict.push_back(std::move(key));
        dict.push_back(std::move(value));
        break;
      }
      case 'u': {
        auto items = pop_to_mark();
        if (items.size() % 2 != 0) fail("SETITEMS with an odd number of values");
        auto& dict = top(Kind::Dict).items;
        dict.insert(dict.end(), items.begin(), items.end());
        break;
      }
      case 'Q': {
        auto node = make(Kind::PersistentId);
        node->items = {pop()};
        stack_.push_back(std::move(node));
        break;
      }
      case 'R': {
        NodePtr args = pop(), callable = pop();
        if (is_global(callable, "collections", "OrderedDict") && args->kind == Kind::Tuple && args->items.empty()) {
          auto dict = make(Kind::Dict);  // Python's state dicts: SETITEMS follow, as on a dict
          dict->name = "OrderedDict";
          stack_.push_back(std::move(dict));
          break;
        }
        stack_.push_back(make_reduce(std::move(callable), std::move(args)));
        break;
      }
      case 0x81: {  // NEWOBJ
        NodePtr args = pop(), cls = pop();
        auto node = make(Kind::NewObj);
        node->items = {std::move(cls), std::move(args)};
        stack_.push_back(std::move(node));
        break;
      }
      case 'b': {
        // BUILD sets the object's state in place, as Python's pickle does: a memo entry taken of
        // the object before (BINPUT after NEWOBJ) must read back the built object, so the node
        // itself becomes the Build node around a copy of what it was.
        NodePtr state = pop(), object = pop();
        auto unbuilt = std::make_shared<Node>(std::move(*object));
        *object = Node{};
        object->kind = Kind::Build;
        object->items = {std::move(unbuilt), std::move(state)};
        stack_.push_back(std::move(object));
        break;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", opcode);
        fail(std::string("opcode ") + hex + " is not one LibTorch writes");
      }
    }
  }

  std::string_view bytes_;
  const std::string& what_;
  size_t at_ = 0;
  std::vector<NodePtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, NodePtr> memo_;
};

void write_node(const Node& node, std::string& out) {
  switch (node.kind) {
    case Kind::None: out += 'N'; break;
    case Kind::Bool: out += static_cast<char>(node.boolean ? 0x88 : 0x89); break;
    case Kind::Int:
      if (node.integer >= 0 && node.integer < 256) {
        out += 'K';
        internal::append_le(out, static_cast<uint64_t>(node.integer), 1);
      } else if (node.integer >= INT32_MIN && node.integer <= INT32_MAX) {
        out += 'J';
        internal::append_le(out, static_cast<uint32_t>(static_cast<int32_t>(node.integer)), 4);
      } else {
        out += static_cast<char>(0x8a);
        out += static_cast<char>(8);
        internal::append_le(out, static_cast<uint64_t>(node.integer), 8);
      }
      break;
    case Kind::Float: {
      uint64_t bits = 0;
      std::memcpy(&bits, &node.real, sizeof bits);
      out += 'G';
      for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
      break;
    }
    case Kind::String:
    case Kind::Bytes:
      out += node.kind == Kind::String ? 'X' : 'B';
      internal::append_le(out, node.text.size(), 4);
      out += node.text;
      break;
    case Kind::Tuple:
      if (node.items.empty()) {
        out += ')';
        break;
      }
      out += '(';
      for (const auto& item : node.items) write_node(*item, out);
      out += 't';
      break;
    case Kind::List:
    case Kind::Dict:
      if (node.kind == Kind::Dict && node.name == "OrderedDict") {
        out += "ccollections\nOrderedDict\n)R";
      } else {
        out += node.kind == Kind::List ? ']' : '}';
      }
      if (node.items.empty()) break;
      out += '(';
      for (const auto& item : node.items) write_node(*item, out);
      out += node.kind == Kind::List ? 'e' : 'u';
      break;
    case Kind::Global: out += "c" + node.text + "\n" + node.name + "\n"; break;
    case Kind::Reduce:
    case Kind::NewObj:
    case Kind::PersistentId:
    case Kind::Build:
      for (const auto& item : node.items) write_node(*item, out);
      out += node.kind == Kind::Reduce ? 'R' : node.kind == Kind::NewObj ? '\x81' : node.kind == Kind::Build ? 'b' : 'Q';
      break;
  }
}

const std::map<std::string, int>& element_sizes() {
  static const std::map<std::string, int> sizes = {
      {"FloatStorage", 4}, {"DoubleStorage", 8}, {"HalfStorage", 2}, {"BFloat16Storage", 2}, {"LongStorage", 8},
      {"IntStorage", 4},   {"ShortStorage", 2},  {"CharStorage", 1}, {"ByteStorage", 1},     {"BoolStorage", 1}};
  return sizes;
}

std::vector<int64_t> int_tuple(const NodePtr& node, bool& ok) {
  std::vector<int64_t> values;
  if (!node || node->kind != Kind::Tuple) {
    ok = false;
    return values;
  }
  for (const auto& item : node->items) {
    if (item->kind != Kind::Int) ok = false;
    values.push_back(item->integer);
  }
  return values;
}

NodePtr int_tuple_node(const std::vector<int64_t>& values) {
  std::vector<NodePtr> items;
  for (int64_t value : values) items.push_back(make_int(value));
  return make_tuple(std::move(items));
}

// The ("storage", torch.XStorage, key, location, numel) tuple of a tensor node, or nullptr.
Node* storage_tuple(const Node& node) {
  if (node.kind != Kind::Reduce || !is_global(node.items[0], "torch._utils", "_rebuild_tensor_v2")) return nullptr;
  const Node& args = *node.items[1];
  if (args.kind != Kind::Tuple || args.items.size() < 4 || args.items[0]->kind != Kind::PersistentId) return nullptr;
  Node& id = *args.items[0]->items[0];
  if (id.kind != Kind::Tuple || id.items.size() != 5 || id.items[0]->text != "storage" ||
      id.items[1]->kind != Kind::Global || id.items[2]->kind != Kind::String || id.items[4]->kind != Kind::Int) {
    return nullptr;
  }
  return &id;
}
}  // namespace

NodePtr make_string(std::string text) {
  auto node = make(Kind::String);
  node->text = std::move(text);
  return node;
}

NodePtr make_float(double value) {
  auto node = make(Kind::Float);
  node->real = value;
  return node;
}

NodePtr make_bool(bool value) {
  auto node = make(Kind::Bool);
  node->boolean = value;
  return node;
}

NodePtr make_int(int64_t value) {
  auto node = make(Kind::Int);
  node->integer = value;
  return node;
}

NodePtr make_tuple(std::vector<NodePtr> items) {
  auto node = make(Kind::Tuple);
  node->items = std::move(items);
  return node;
}

NodePtr parse(std::string_view bytes, const std::string& what) { return Parser(bytes, what).run(); }

NodePtr plain_dicts(const NodePtr& node) {
  if (!node) return node;
  if (node->kind == Kind::Build && node->items[0]->kind == Kind::Dict) return plain_dicts(node->items[0]);
  if (storage_tuple(*node) != nullptr) return node;  // a tensor: LibTorch reads its arguments itself
  const bool containers = node->kind == Kind::Dict || node->kind == Kind::List || node->kind == Kind::Tuple ||
                          node->kind == Kind::Reduce || node->kind == Kind::NewObj || node->kind == Kind::Build;
  if (!containers) return node;
  auto copy = std::make_shared<Node>(*node);
  if (copy->kind == Kind::Dict) copy->name.clear();
  for (auto& item : copy->items) item = plain_dicts(item);
  return copy;
}

std::string write(const Node& root) {
  std::string out = "\x80\x02";
  write_node(root, out);
  out += '.';
  return out;
}

Node* as_dict(const NodePtr& node) {
  if (!node) return nullptr;
  if (node->kind == Kind::Dict) return node.get();
  if (node->kind == Kind::Reduce && is_global(node->items[0], "torch.jit._pickle", "restore_type_tag") &&
      node->items[1]->kind == Kind::Tuple && !node->items[1]->items.empty() &&
      node->items[1]->items[0]->kind == Kind::Dict) {
    return node->items[1]->items[0].get();
  }
  return nullptr;
}

NodePtr* dict_find(Node& dict, const std::string& key) {
  for (size_t i = 0; i + 1 < dict.items.size(); i += 2) {
    const Node& candidate = *dict.items[i];
    if ((candidate.kind == Kind::String && candidate.text == key) ||
        (candidate.kind == Kind::Int && std::to_string(candidate.integer) == key)) {
      return &dict.items[i + 1];
    }
  }
  return nullptr;
}

std::optional<TensorRecord> as_tensor(const Node& node) {
  const Node* id = storage_tuple(node);
  if (id == nullptr) return std::nullopt;
  const Node& args = *node.items[1];
  TensorRecord tensor;
  tensor.storage_type = id->items[1]->name;
  tensor.key = id->items[2]->text;
  tensor.location = id->items[3]->text;
  tensor.storage_numel = id->items[4]->integer;
  if (args.items[1]->kind != Kind::Int) return std::nullopt;
  tensor.offset = args.items[1]->integer;
  bool ok = true;
  tensor.sizes = int_tuple(args.items[2], ok);
  tensor.strides = int_tuple(args.items[3], ok);
  if (!ok) return std::nullopt;
  return tensor;
}

NodePtr make_tensor(const TensorRecord& tensor) {
  auto id = make_tuple({make_string("storage"), make_global("torch", tensor.storage_type), make_string(tensor.key),
                        make_string(tensor.location), make_int(tensor.storage_numel)});
  auto persistent = make(Kind::PersistentId);
  persistent->items = {id};
  auto requires_grad = make(Kind::Bool);
  auto hooks = make_reduce(make_global("collections", "OrderedDict"), make_tuple({}));
  return make_reduce(make_global("torch._utils", "_rebuild_tensor_v2"),
                     make_tuple({persistent, make_int(tensor.offset), int_tuple_node(tensor.sizes),
                                 int_tuple_node(tensor.strides), requires_grad, hooks}));
}

void set_tensor_key(Node& tensor, const std::string& key) {
  Node* id = storage_tuple(tensor);
  if (id != nullptr) id->items[2] = make_string(key);  // a fresh node: the old one may be shared by the memo
}

int element_size(const std::string& storage_type) {
  auto found = element_sizes().find(storage_type);
  return found == element_sizes().end() ? 0 : found->second;
}

std::string storage_type_of(const std::string& dtype) {
  static const std::map<std::string, std::string> types = {
      {"Float", "FloatStorage"}, {"Double", "DoubleStorage"}, {"Half", "HalfStorage"}, {"BFloat16", "BFloat16Storage"},
      {"Long", "LongStorage"},   {"Int", "IntStorage"},       {"Short", "ShortStorage"}, {"Char", "CharStorage"},
      {"Byte", "ByteStorage"},   {"Bool", "BoolStorage"}};
  auto found = types.find(dtype);
  return found == types.end() ? std::string() : found->second;
}

}  // namespace lightning::fabric::pickle
