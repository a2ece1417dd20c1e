#include "lightning/fabric/data/litdata_format.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <stdexcept>

namespace lightning::fabric::data_detail {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;  // JSON values keep their keys' written order, as Python's
constexpr int kMaxDepth = 256;                 // nesting a damaged leaf may claim before it is refused

[[noreturn]] void fail(const std::string& message) { throw std::runtime_error(message); }

// --- dtype codes -----------------------------------------------------------------------------

// LitData's torch codes: several read as one dtype; the writer emits the last of each.
at::ScalarType torch_code_dtype(int64_t code) {
  switch (code) {
    case 0: case 1: return at::kFloat;
    case 2: case 3: return at::kDouble;
    case 4: case 5: return at::kComplexFloat;
    case 6: case 7: return at::kComplexDouble;
    case 8: case 9: return at::kHalf;
    case 10: return at::kBFloat16;
    case 11: return at::kByte;
    case 12: return at::kChar;
    case 13: case 14: return at::kShort;
    case 15: case 16: return at::kInt;
    case 17: case 18: return at::kLong;
    case 19: return at::kBool;
    case 20: return at::kUInt16;
    default: fail("unknown tensor dtype code " + std::to_string(code) + " (LitData's codes are 0 to 20)");
  }
}
int torch_dtype_code(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return 1;
    case at::kDouble: return 3;
    case at::kComplexFloat: return 5;
    case at::kComplexDouble: return 7;
    case at::kHalf: return 9;
    case at::kBFloat16: return 10;
    case at::kByte: return 11;
    case at::kChar: return 12;
    case at::kShort: return 14;
    case at::kInt: return 16;
    case at::kLong: return 18;
    case at::kBool: return 19;
    case at::kUInt16: return 20;
    default: fail(std::string("dtype ") + c10::toString(type) + " has no LitData tensor code");
  }
}
// NumPy codes: indices into litdata's list of scalar types (object, bytes, str, void unsupported).
at::ScalarType numpy_code_dtype(int64_t code) {
  static const at::ScalarType types[] = {at::kChar,  at::kShort,  at::kInt,   at::kLong,         at::kByte,
                                         at::kUInt16, at::kUInt32, at::kUInt64, at::kHalf,        at::kFloat,
                                         at::kDouble, at::kComplexFloat, at::kComplexDouble, at::kBool};
  if (code < 0 || code >= 14)
    fail("NumPy dtype code " + std::to_string(code) +
         " (object, bytes, str or void arrays, or unknown) has no tensor equivalent");
  return types[code];
}
int numpy_dtype_code(at::ScalarType type) {
  for (int code = 0; code < 14; ++code)
    if (numpy_code_dtype(code) == type) return code;
  fail(std::string("dtype ") + c10::toString(type) + " has no LitData NumPy code");
}

template <class T> T read_le(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}
uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
template <class T> void append_le(std::string& out, T value) { out.append(reinterpret_cast<const char*>(&value), sizeof(T)); }
void append_be32(std::string& out, uint32_t value) {
  const char bytes[4] = {char(value >> 24), char(value >> 16), char(value >> 8), char(value)};
  out.append(bytes, 4);
}

at::Tensor tensor_from_bytes(const uint8_t* data, size_t size, at::ScalarType type, std::vector<int64_t> shape) {
  const size_t element = c10::elementSize(type);
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  if (size != static_cast<size_t>(count) * element)
    fail("tensor data has " + std::to_string(size) + " bytes, its header asks for " + std::to_string(count * element));
  at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(type));
  if (size) std::memcpy(tensor.data_ptr(), data, size);
  return tensor;
}
std::string tensor_bytes(const at::Tensor& tensor) {
  at::Tensor host = tensor.to(at::kCPU).contiguous();
  return std::string(static_cast<const char*>(host.data_ptr()), host.numel() * host.element_size());
}

// --- json leaves -----------------------------------------------------------------------------

c10::IValue from_json(const ordered_json& value, int depth = 0) {
  if (depth > kMaxDepth) fail("json leaf nests deeper than " + std::to_string(kMaxDepth) + " levels");
  switch (value.type()) {
    case ordered_json::value_t::null: return c10::IValue();
    case ordered_json::value_t::boolean: return value.get<bool>();
    case ordered_json::value_t::number_integer: return value.get<int64_t>();
    case ordered_json::value_t::number_unsigned: {
      const uint64_t number = value.get<uint64_t>();
      if (number > static_cast<uint64_t>(INT64_MAX)) return static_cast<double>(number);  // past int64: as a double
      return static_cast<int64_t>(number);
    }
    case ordered_json::value_t::number_float: return value.get<double>();
    case ordered_json::value_t::string: return value.get<std::string>();
    case ordered_json::value_t::array: {
      c10::impl::GenericList list(c10::AnyType::get());
      for (const auto& element : value) list.push_back(from_json(element, depth + 1));
      return list;
    }
    case ordered_json::value_t::object: {
      c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
      for (const auto& [key, element] : value.items()) dict.insert(key, from_json(element, depth + 1));
      return dict;
    }
    default: fail("json leaf: unsupported JSON value");
  }
}

struct Cursor {
  const uint8_t* begin;  // the whole leaf: what an unknown tag reads as plain JSON, as Python does
  const uint8_t* p;
  const uint8_t* end;
  void need(size_t n) const {
    if (static_cast<size_t>(end - p) < n) fail("json leaf is truncated");
  }
  template <class T> T take() {
    need(sizeof(T));
    T value = read_le<T>(p);
    p += sizeof(T);
    return value;
  }
  std::string text() {
    const uint32_t n = take<uint32_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
};

c10::IValue parse_json(const uint8_t* begin, const uint8_t* end) {
  try {
    return from_json(ordered_json::parse(begin, end));
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("json leaf is not valid JSON: ") + e.what());
  }
}

c10::IValue nested_loads(Cursor& in, int depth = 0) {
  if (depth > kMaxDepth) fail("json leaf nests deeper than " + std::to_string(kMaxDepth) + " levels");
  const uint8_t tag = in.take<uint8_t>();
  c10::impl::GenericList list(c10::AnyType::get());
  switch (tag) {
    case 0: {
      const std::string text = in.text();
      return parse_json(reinterpret_cast<const uint8_t*>(text.data()), reinterpret_cast<const uint8_t*>(text.data()) + text.size());
    }
    case 1: for (uint32_t n = in.take<uint32_t>(); n > 0; --n) list.push_back(in.text()); return list;
    case 2: for (uint32_t n = in.take<uint32_t>(); n > 0; --n) list.push_back(in.take<int64_t>()); return list;
    case 3: for (uint32_t n = in.take<uint32_t>(); n > 0; --n) list.push_back(in.take<double>()); return list;
    case 4: for (uint32_t n = in.take<uint32_t>(); n > 0; --n) list.push_back(in.take<uint8_t>() != 0); return list;
    case 5: {
      c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
      for (uint32_t n = in.take<uint32_t>(); n > 0; --n) {
        std::string key = in.text();
        dict.insert(std::move(key), nested_loads(in, depth + 1));
      }
      return dict;
    }
    case 6: {
      const uint32_t rows = in.take<uint32_t>(), width = in.take<uint32_t>();
      std::vector<std::string> keys;
      for (uint32_t k = 0; k < width; ++k) keys.push_back(in.text());
      for (uint32_t r = 0; r < rows; ++r) {
        c10::impl::GenericDict row(c10::StringType::get(), c10::AnyType::get());
        for (const auto& key : keys) {
          switch (const uint8_t kind = in.take<uint8_t>()) {
            case 0x10: row.insert(key, c10::IValue()); break;
            case 0x11: row.insert(key, in.text()); break;
            case 0x12: row.insert(key, in.take<int64_t>()); break;
            case 0x13: row.insert(key, in.take<double>()); break;
            case 0x14: row.insert(key, in.take<uint8_t>() != 0); break;
            default: fail("json leaf: unknown row value tag " + std::to_string(kind));
          }
        }
        list.push_back(row);
      }
      return list;
    }
    case 7: return in.text();
    case 8: return in.take<int64_t>();
    case 9: return in.take<double>();
    case 10: return in.take<uint8_t>() != 0;
    case 11: return c10::IValue();
    default: return parse_json(in.begin, in.end);  // not a tag: plain JSON, as Python reads it
  }
}

c10::IValue decode_json_leaf(const uint8_t* data, size_t size) {
  if (size == 0) fail("json leaf is empty");
  if (data[0] > 0x20) return parse_json(data, data + size);  // plain JSON (older writers)
  Cursor in{data, data, data + size};
  return nested_loads(in);
}

// --- pil -------------------------------------------------------------------------------------

c10::IValue decode_pil(const uint8_t* data, size_t size) {
  if (size < 12) fail("pil leaf is shorter than its 12-byte header");
  const uint32_t width = read_le<uint32_t>(data), height = read_le<uint32_t>(data + 4),
                 mode_size = read_le<uint32_t>(data + 8);
  if (size - 12 < size_t{mode_size}) fail("pil leaf is truncated");
  const std::string mode(reinterpret_cast<const char*>(data + 12), mode_size);
  struct Layout { const char* mode; at::ScalarType type; int64_t bands; };
  static const Layout layouts[] = {{"L", at::kByte, 1},   {"P", at::kByte, 1},    {"RGB", at::kByte, 3},
                                   {"RGBA", at::kByte, 4}, {"LA", at::kByte, 2},   {"CMYK", at::kByte, 4},
                                   {"YCbCr", at::kByte, 3}, {"I", at::kInt, 1},    {"F", at::kFloat, 1},
                                   {"I;16", at::kUInt16, 1}};
  for (const auto& layout : layouts) {
    if (mode != layout.mode) continue;
    std::vector<int64_t> shape = {height, width};
    if (layout.bands > 1) shape.push_back(layout.bands);
    return tensor_from_bytes(data + 12 + mode_size, size - 12 - mode_size, layout.type, shape);
  }
  fail("pil leaf in PIL mode '" + mode + "', which has no tensor layout here (L, P, RGB, RGBA, LA, CMYK, YCbCr, I, F, I;16)");
}

bool is_pickled_none(const uint8_t* data, size_t size) {
  // protocol 2+ framing: \x80 <protocol> N . ; protocol 0/1: N .
  return (size == 4 && data[0] == 0x80 && data[2] == 'N' && data[3] == '.') || (size == 2 && data[0] == 'N' && data[1] == '.');
}

std::string format_key(const std::string& format) {
  // LitData picks the serializer by the part after ':' when that names one, else by the part before.
  const auto colon = format.find(':');
  if (colon == std::string::npos) return format;
  static const char* keys[] = {"str", "text", "bool", "int", "float", "video", "audio", "image", "nifti", "mesh",
                               "pdf", "graph", "tifffile", "file", "pil", "jpeg", "jpeg_array", "bytes",
                               "no_header_numpy", "numpy", "no_header_tensor", "tensor", "json", "pickle"};
  const std::string sub = format.substr(colon + 1);
  for (const char* key : keys)
    if (sub == key) return sub;
  return format.substr(0, colon);
}

int64_t format_code(const std::string& format) {
  const auto colon = format.find(':');
  try {
    return std::stoll(format.substr(colon + 1));
  } catch (const std::exception&) {
    fail("format '" + format + "' needs a dtype code after ':'");
  }
}

}  // namespace

// --- tree spec -------------------------------------------------------------------------------

size_t TreeSpec::leaves() const {
  if (kind == Kind::Leaf) return 1;
  size_t n = 0;
  for (const auto& child : children) n += child.leaves();
  return n;
}
bool TreeSpec::operator==(const TreeSpec& other) const {
  return kind == other.kind && keys == other.keys && children == other.children;
}

namespace {
TreeSpec parse_node(const json& node) {
  TreeSpec spec;
  const json& type = node.at("type");
  if (type.is_null()) return spec;
  const std::string name = type.get<std::string>();
  if (name == "builtins.tuple") spec.kind = TreeSpec::Kind::Tuple;
  else if (name == "builtins.list") spec.kind = TreeSpec::Kind::List;
  else if (name == "builtins.dict" || name == "collections.OrderedDict") {
    spec.kind = TreeSpec::Kind::Dict;
    const json keys = json::parse(node.at("context").get<std::string>());
    for (const auto& key : keys) {
      if (!key.is_string()) fail("data_spec: a dict key that is not a string (" + key.dump() + ")");
      spec.keys.push_back(key.get<std::string>());
    }
  } else {
    fail("data_spec: container type '" + name + "' is not readable here (tuple, list, dict, OrderedDict)");
  }
  for (const auto& child : node.at("children_spec")) spec.children.push_back(parse_node(child));
  if (spec.kind == TreeSpec::Kind::Dict && spec.keys.size() != spec.children.size())
    fail("data_spec: a dict with " + std::to_string(spec.keys.size()) + " keys and " +
         std::to_string(spec.children.size()) + " children");
  return spec;
}
}  // namespace

TreeSpec parse_tree_spec(const std::string& data_spec) {
  json parsed;
  try {
    parsed = json::parse(data_spec);
  } catch (const std::exception& e) {
    fail(std::string("data_spec is not JSON: ") + e.what());
  }
  if (!parsed.is_array() || parsed.size() != 2 || parsed[0] != 1)
    fail("data_spec is not a [1, node] pytree spec (protocol 1)");
  try {
    return parse_node(parsed[1]);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("data_spec: ") + e.what());
  }
}

std::string tree_spec_json(const TreeSpec& spec) {
  // Python's json.dumps layout: ", " and ": " separators, keys in type/context/children_spec order.
  std::function<std::string(const TreeSpec&)> write = [&](const TreeSpec& node) {
    std::string out = "{\"type\": ";
    switch (node.kind) {
      case TreeSpec::Kind::Leaf: out += "null, \"context\": null"; break;
      case TreeSpec::Kind::Tuple: out += "\"builtins.tuple\", \"context\": \"null\""; break;
      case TreeSpec::Kind::List: out += "\"builtins.list\", \"context\": \"null\""; break;
      case TreeSpec::Kind::Dict: {
        std::string keys = "[";
        for (size_t i = 0; i < node.keys.size(); ++i) keys += (i ? ", " : "") + json(node.keys[i]).dump();
        keys += "]";
        out += "\"builtins.dict\", \"context\": " + json(keys).dump();
        break;
      }
    }
    out += ", \"children_spec\": [";
    for (size_t i = 0; i < node.children.size(); ++i) out += (i ? ", " : "") + write(node.children[i]);
    return out + "]}";
  };
  return "[1, " + write(spec) + "]";
}

TreeSpec tree_spec_of(const c10::IValue& item) {
  TreeSpec spec;
  if (item.isTuple()) {
    spec.kind = TreeSpec::Kind::Tuple;
    for (const auto& element : item.toTupleRef().elements()) spec.children.push_back(tree_spec_of(element));
  } else if (item.isList()) {
    spec.kind = TreeSpec::Kind::List;
    for (const auto& element : item.toListRef()) spec.children.push_back(tree_spec_of(element));
  } else if (item.isGenericDict()) {
    spec.kind = TreeSpec::Kind::Dict;
    for (const auto& entry : item.toGenericDict()) {
      if (!entry.key().isString()) fail("a dict key that is not a string (" + entry.key().tagKind() + ")");
      spec.keys.push_back(entry.key().toStringRef());
      spec.children.push_back(tree_spec_of(entry.value()));
    }
  }
  return spec;
}

void flatten(const c10::IValue& item, std::vector<c10::IValue>& leaves) {
  if (item.isTuple()) {
    for (const auto& element : item.toTupleRef().elements()) flatten(element, leaves);
  } else if (item.isList()) {
    for (const auto& element : item.toListRef()) flatten(element, leaves);
  } else if (item.isGenericDict()) {
    for (const auto& entry : item.toGenericDict()) flatten(entry.value(), leaves);
  } else {
    leaves.push_back(item);
  }
}

namespace {
c10::IValue unflatten_at(const TreeSpec& spec, std::vector<c10::IValue>& leaves, size_t& next) {
  switch (spec.kind) {
    case TreeSpec::Kind::Leaf: return std::move(leaves.at(next++));
    case TreeSpec::Kind::Tuple: {
      std::vector<c10::IValue> elements;
      for (const auto& child : spec.children) elements.push_back(unflatten_at(child, leaves, next));
      return c10::ivalue::Tuple::create(std::move(elements));
    }
    case TreeSpec::Kind::List: {
      c10::impl::GenericList list(c10::AnyType::get());
      for (const auto& child : spec.children) list.push_back(unflatten_at(child, leaves, next));
      return list;
    }
    case TreeSpec::Kind::Dict: {
      c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
      for (size_t i = 0; i < spec.children.size(); ++i) dict.insert(spec.keys[i], unflatten_at(spec.children[i], leaves, next));
      return dict;
    }
  }
  return {};
}
}  // namespace

c10::IValue unflatten(const TreeSpec& spec, std::vector<c10::IValue>& leaves) {
  size_t next = 0;
  return unflatten_at(spec, leaves, next);
}

// --- leaves ----------------------------------------------------------------------------------

namespace {
const char* const kReadable[] = {"int", "float", "bool", "str", "text", "bytes", "file", "tensor", "numpy",
                                 "no_header_tensor", "no_header_numpy", "jpeg", "image", "jpeg_array", "pil",
                                 "json", "pickle"};
const char* kReadableList =
    "int, float, bool, str, text, bytes, file, tensor, no_header_tensor, numpy, no_header_numpy, jpeg, image, "
    "jpeg_array, pil, json, pickle of None";
}  // namespace

void check_readable_format(const std::string& format) {
  const std::string key = format_key(format);
  for (const char* readable : kReadable) {
    if (key != readable) continue;
    if (key == "no_header_tensor") torch_code_dtype(format_code(format));
    if (key == "no_header_numpy") numpy_code_dtype(format_code(format));
    return;
  }
  fail("leaf format '" + format + "' is not readable here (" + kReadableList + ")");
}

c10::IValue decode_leaf(const std::string& format, const uint8_t* data, size_t size) {
  const std::string key = format_key(format);
  auto fixed = [&](size_t want) {
    if (size != want) fail("a '" + key + "' leaf has " + std::to_string(size) + " bytes, not " + std::to_string(want));
  };
  if (key == "int") return fixed(8), c10::IValue(read_le<int64_t>(data));
  if (key == "float") return fixed(8), c10::IValue(read_le<double>(data));
  if (key == "bool") return fixed(1), c10::IValue(data[0] != 0);
  if (key == "str" || key == "text" || key == "bytes" || key == "file")
    return c10::IValue(std::string(reinterpret_cast<const char*>(data), size));
  if (key == "tensor") {
    if (size < 8) fail("a 'tensor' leaf is shorter than its header");
    const at::ScalarType type = torch_code_dtype(read_be32(data));
    const uint32_t rank = read_be32(data + 4);
    if (size < 8 + 4 * size_t{rank}) fail("a 'tensor' leaf is shorter than its shape");
    std::vector<int64_t> shape;
    for (uint32_t d = 0; d < rank; ++d) shape.push_back(read_be32(data + 8 + 4 * d));
    const size_t header = 8 + 4 * size_t{rank};
    if (size == header) return at::empty(shape, at::TensorOptions().dtype(type));  // as Python: torch.empty
    return tensor_from_bytes(data + header, size - header, type, shape);
  }
  if (key == "numpy") {
    if (size < 8) fail("a 'numpy' leaf is shorter than its header");
    const at::ScalarType type = numpy_code_dtype(read_le<uint32_t>(data));
    const uint32_t rank = read_le<uint32_t>(data + 4);
    if (size < 8 + 4 * size_t{rank}) fail("a 'numpy' leaf is shorter than its shape");
    std::vector<int64_t> shape;
    for (uint32_t d = 0; d < rank; ++d) shape.push_back(read_le<uint32_t>(data + 8 + 4 * d));
    const size_t header = 8 + 4 * size_t{rank};
    return tensor_from_bytes(data + header, size - header, type, shape);
  }
  if (key == "no_header_tensor" || key == "no_header_numpy") {
    const at::ScalarType type = key == "no_header_tensor" ? torch_code_dtype(format_code(format)) : numpy_code_dtype(format_code(format));
    const size_t element = c10::elementSize(type);
    if (size % element) fail("a '" + format + "' leaf of " + std::to_string(size) + " bytes is not whole elements");
    return tensor_from_bytes(data, size, type, {static_cast<int64_t>(size / element)});
  }
  if (key == "jpeg" || key == "image") return decode_image_rgb(data, size);
  if (key == "jpeg_array") {
    if (size < 4) fail("a 'jpeg_array' leaf is shorter than its header");
    const uint32_t n = read_le<uint32_t>(data);
    if (size < 4 + 4 * size_t{n}) fail("a 'jpeg_array' leaf is shorter than its sizes");
    c10::impl::GenericList images(c10::AnyType::get());
    size_t offset = 4 + 4 * size_t{n};
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t length = read_le<uint32_t>(data + 4 + 4 * i);
      if (offset + length > size) fail("a 'jpeg_array' leaf is truncated");
      images.push_back(decode_image_rgb(data + offset, length));
      offset += length;
    }
    return images;
  }
  if (key == "pil") return decode_pil(data, size);
  if (key == "json") return decode_json_leaf(data, size);
  if (key == "pickle") {
    if (is_pickled_none(data, size)) return c10::IValue();
    fail("a 'pickle' leaf holds a Python object (only None is readable here); write that field as a str, "
         "int, float, bytes, NumPy array or tensor");
  }
  fail("leaf format '" + format + "' is not readable here (" + kReadableList + ")");
}

std::string default_format(const c10::IValue& leaf) {
  if (leaf.isBool()) return "bool";
  if (leaf.isInt()) return "int";
  if (leaf.isDouble()) return "float";
  if (leaf.isString()) return "str";
  if (leaf.isNone()) return "pickle";
  if (leaf.isTensor()) {
    const at::Tensor& tensor = leaf.toTensor();
    if (tensor.dim() == 1) return "no_header_tensor:" + std::to_string(torch_dtype_code(tensor.scalar_type()));
    return "tensor";
  }
  fail("a leaf of type " + leaf.tagKind() + " has no LitData format (" + writable_formats() + ")");
}

const char* writable_formats() {
  return "int, float, bool, str, bytes (a string), tensor and no_header_tensor:CODE (a tensor), numpy and "
         "no_header_numpy:CODE (a tensor), jpeg (a uint8 [3, H, W] or [H, W] tensor, or a string of JPEG bytes), "
         "pickle (None)";
}

std::string encode_leaf(const std::string& format, const c10::IValue& leaf) {
  const std::string key = format_key(format);
  auto want = [&](bool ok, const char* what) {
    if (!ok) fail("format '" + format + "' takes " + what + ", not a " + leaf.tagKind());
  };
  std::string out;
  if (key == "int") {
    want(leaf.isInt(), "an int");
    append_le<int64_t>(out, leaf.toInt());
  } else if (key == "float") {
    want(leaf.isDouble() || leaf.isInt(), "a double");
    append_le<double>(out, leaf.isInt() ? static_cast<double>(leaf.toInt()) : leaf.toDouble());
  } else if (key == "bool") {
    want(leaf.isBool(), "a bool");
    out.push_back(leaf.toBool() ? 1 : 0);
  } else if (key == "str" || key == "text" || key == "bytes" || key == "file") {
    want(leaf.isString(), "a string");
    out = leaf.toStringRef();
  } else if (key == "tensor" || key == "numpy") {
    want(leaf.isTensor(), "a tensor");
    const at::Tensor& tensor = leaf.toTensor();
    if (key == "tensor") {
      append_be32(out, torch_dtype_code(tensor.scalar_type()));
      append_be32(out, static_cast<uint32_t>(tensor.dim()));
      for (int64_t dim : tensor.sizes()) append_be32(out, static_cast<uint32_t>(dim));
    } else {
      append_le<uint32_t>(out, numpy_dtype_code(tensor.scalar_type()));
      append_le<uint32_t>(out, static_cast<uint32_t>(tensor.dim()));
      for (int64_t dim : tensor.sizes()) append_le<uint32_t>(out, static_cast<uint32_t>(dim));
    }
    out += tensor_bytes(tensor);
  } else if (key == "no_header_tensor" || key == "no_header_numpy") {
    want(leaf.isTensor() && leaf.toTensor().dim() == 1, "a 1-D tensor");
    const at::ScalarType type = key == "no_header_tensor" ? torch_code_dtype(format_code(format)) : numpy_code_dtype(format_code(format));
    if (leaf.toTensor().scalar_type() != type)
      fail("format '" + format + "' stores " + c10::toString(type) + ", the tensor is " + c10::toString(leaf.toTensor().scalar_type()));
    out = tensor_bytes(leaf.toTensor());
  } else if (key == "jpeg") {
    want(leaf.isTensor() || leaf.isString(), "a uint8 image tensor or a string of JPEG bytes");
    out = leaf.isString() ? leaf.toStringRef() : encode_jpeg(leaf.toTensor(), 90);
  } else if (key == "pickle") {
    want(leaf.isNone(), "None");
    out = std::string("\x80\x04N.", 4);
  } else {
    fail("format '" + format + "' is not writable here (" + writable_formats() + ")");
  }
  return out;
}

}  // namespace lightning::fabric::data_detail
