// LitData's item encoding (litdata 0.2.76, PyTreeLoader): the pytree spec of an item, and the
// bytes of each leaf format, both ways; and the index parts several writers leave. Errors are
// std::runtime_error with the cause only; the dataset and the writer add the file and the item.
#pragma once

#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace lightning::fabric::data_detail {

/// An item's structure (Python's TreeSpec): a leaf, or a tuple, list or dict of children.
struct TreeSpec {
  enum class Kind { Leaf, Tuple, List, Dict } kind = Kind::Leaf;
  std::vector<std::string> keys;  // a dict's, in order
  std::vector<TreeSpec> children;
  size_t leaves() const;
  bool operator==(const TreeSpec& other) const;
};

/// index.json's data_spec (a JSON string holding [1, node]) and back.
TreeSpec parse_tree_spec(const std::string& data_spec);
std::string tree_spec_json(const TreeSpec& spec);
/// The structure of a written item, its leaves in flattening order, and an item from leaves.
TreeSpec tree_spec_of(const c10::IValue& item);
void flatten(const c10::IValue& item, std::vector<c10::IValue>& leaves);
c10::IValue unflatten(const TreeSpec& spec, std::vector<c10::IValue>& leaves);

/// Throws unless leaves of this format (a data_format name) can be decoded here.
void check_readable_format(const std::string& format);
/// A leaf's value from its bytes, by LitData format name (as in data_format).
c10::IValue decode_leaf(const std::string& format, const uint8_t* data, size_t size);
/// A leaf's bytes in a format; the format a leaf gets when the writer is not told.
std::string encode_leaf(const std::string& format, const c10::IValue& leaf);
std::string default_format(const c10::IValue& leaf);
/// Formats a C++ value can be written in (for the writer's error messages).
const char* writable_formats();

/// The RANK.index.json files that writers with a writer_rank left in `dir`, joined in rank order
/// (chunks appended; every part must have the first one's item format), and their paths. A null
/// index and no paths when there are none. `who` begins the errors (lf::ValueError).
std::pair<nlohmann::json, std::vector<std::filesystem::path>> merge_writer_indexes(const std::filesystem::path& dir,
                                                                                  const std::string& who);

/// zstd, LitData's compression: a frame (or frames back to back) inflated, `expected_size` its
/// content's size when known (0: read from the frame, else grown as needed); bytes deflated at a
/// level. std::runtime_error for damaged data, or when this build has no zstd (zstd_available).
bool zstd_available();
std::string zstd_inflate(const uint8_t* data, size_t size, size_t expected_size);
std::string zstd_deflate(const uint8_t* data, size_t size, int level);

/// JPEG or PNG bytes to a uint8 [3, H, W] RGB tensor (torchvision's decode_image(mode=RGB));
/// a uint8 [3, H, W] or [H, W] tensor to JPEG bytes.
at::Tensor decode_image_rgb(const uint8_t* data, size_t size);
std::string encode_jpeg(const at::Tensor& image, int quality);

}  // namespace lightning::fabric::data_detail
