#include "lightning/fabric/checkpoint/sharded_format.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "lightning/fabric/checkpoint/atomic_file.h"
#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

namespace {
constexpr const char* kFormat = "lightning-fabric-sharded";
constexpr int kLayoutVersion = 1;
}  // namespace

ShardSlice shard_slice(int64_t numel, int parts, int part) {
  const int64_t chunk = (numel + parts - 1) / parts;
  const int64_t begin = std::min(numel, chunk * part);
  return {begin, std::min(numel, begin + chunk) - begin};
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t size : shape) count *= size;
  return count;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

int64_t ShardedTensorLayout::numel() const { return element_count(shape); }

std::string shard_file_name(int part, int parts) {
  return "shard-" + std::to_string(part) + "-of-" + std::to_string(parts) + ".pt";
}

std::vector<std::string> split_checkpoint_path(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream stream(path);
  std::string part;
  while (std::getline(stream, part, '/')) parts.push_back(part);
  return parts;
}

void write_sharded_layout(const fs::path& folder, const ShardedLayout& layout) {
  nlohmann::json json = {{"format", kFormat}, {"version", kLayoutVersion}, {"world_size", layout.world_size},
                         {"parts", layout.parts}, {"tensors", nlohmann::json::object()}};
  for (const auto& [path, tensor] : layout.tensors) json["tensors"][path] = {{"shape", tensor.shape}, {"dtype", tensor.dtype}};
  write_file_atomically(folder / "metadata.json", json.dump(1));
}

bool is_sharded_checkpoint(const fs::path& folder) {
  return fs::is_directory(folder) && fs::is_regular_file(folder / "metadata.json");
}

ShardedLayout read_sharded_layout(const fs::path& folder) {
  LF_CHECK(fs::exists(folder), RuntimeError, "Sharded checkpoint ", folder.string(), " does not exist.");
  LF_CHECK(fs::is_directory(folder), RuntimeError, folder.string(), " is a file, not a sharded checkpoint folder. ",
           "A single-file checkpoint needs no consolidation: fabric.load and torch.load read it as it is.");
  LF_CHECK(fs::is_regular_file(folder / "metadata.json"), RuntimeError, "Folder ", folder.string(),
           " is not a sharded checkpoint: it has no metadata.json (fsdp writes one with every sharded save).");
  ShardedLayout layout;
  try {
    nlohmann::json json;
    std::ifstream(folder / "metadata.json") >> json;
    LF_CHECK(json.value("format", "") == kFormat && json.value("version", 0) == kLayoutVersion, RuntimeError,
             "The metadata.json of ", folder.string(), " is not a ", kFormat, " version ", kLayoutVersion, " file.");
    layout.world_size = json.at("world_size").get<int>();
    layout.parts = json.at("parts").get<int>();
    for (const auto& [path, info] : json.at("tensors").items()) {
      layout.tensors[path] = {info.at("shape").get<std::vector<int64_t>>(), info.at("dtype").get<std::string>()};
    }
  } catch (const nlohmann::json::exception& error) {
    throw RuntimeError("The metadata.json of " + folder.string() + " is not valid (" + error.what() + ").");
  }
  LF_CHECK(layout.parts >= 1, RuntimeError, "The metadata.json of ", folder.string(), " names ", layout.parts,
           " parts; a sharded checkpoint has at least one.");
  return layout;
}

}  // namespace lightning::fabric
