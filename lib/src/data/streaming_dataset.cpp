#include "lightning/fabric/data/streaming_dataset.h"

#include "lightning/fabric/data/litdata_format.h"
#include "lightning/fabric/errors.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <mutex>

namespace lightning::fabric {

namespace data_detail {

namespace {
using json = nlohmann::json;
constexpr char kArrowFooterMagic[8] = {'L', 'D', 'A', 'R', 'W', '0', '1', '\0'};
constexpr char kFramedMagic[8] = {'L', 'D', 'F', 'Z', '0', '1', '\0', '\0'};
}  // namespace

/// One chunk file, mapped whole when first read.
struct Chunk {
  std::string filename;
  int64_t items = 0;
  int64_t bytes = 0;
  std::once_flag mapped;
  const uint8_t* data = nullptr;
  size_t size = 0;
  ~Chunk() {
    if (data) munmap(const_cast<uint8_t*>(data), size);
  }
};

struct DatasetFiles {
  std::filesystem::path dir;
  std::vector<std::unique_ptr<Chunk>> chunks;
  std::vector<int64_t> chunk_sizes;
  std::vector<int64_t> starts;  // global index of each chunk's first item
  int64_t items = 0;
  std::vector<std::string> data_format;
  TreeSpec spec;

  std::string where(const Chunk& chunk) const {
    return "StreamingDataset(" + dir.string() + "): chunk " + chunk.filename;
  }

  // Maps the chunk and checks its header against the index (once).
  const Chunk& open(size_t c) const {
    Chunk& chunk = *chunks[c];
    std::call_once(chunk.mapped, [&] {
      const auto path = dir / chunk.filename;
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      LF_CHECK(fd >= 0, RuntimeError, where(chunk), " cannot be opened: ", std::strerror(errno),
               ". The folder lacks a chunk that index.json lists: copy the whole dataset folder again, or write it again");
      struct stat info {};
      fstat(fd, &info);
      const size_t size = static_cast<size_t>(info.st_size);
      void* mapping = size ? mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
      ::close(fd);
      LF_CHECK(size == 0 || mapping != MAP_FAILED, RuntimeError, where(chunk), " cannot be mapped: ", std::strerror(errno));
      const auto* data = static_cast<const uint8_t*>(size ? mapping : nullptr);
      auto damaged = [&](const std::string& why) {
        if (data) munmap(const_cast<uint8_t*>(data), size);
        throw RuntimeError(where(chunk) + " is damaged: " + why +
                           ". Copy the dataset folder again, or write the dataset again");
      };
      if (static_cast<int64_t>(size) < chunk.bytes)
        damaged("it has " + std::to_string(size) + " bytes, index.json says " + std::to_string(chunk.bytes));
      if (size >= 8 && std::memcmp(data, kFramedMagic, 8) == 0) {
        if (data) munmap(const_cast<uint8_t*>(data), size);
        throw RuntimeError(where(chunk) + " is zstd-compressed (compression=\"zstd\"), which this reader does not "
                           "decompress; write the dataset without compression");
      }
      if (size >= 8 && std::memcmp(data + size - 8, kArrowFooterMagic, 8) == 0) {
        if (data) munmap(const_cast<uint8_t*>(data), size);
        throw RuntimeError(where(chunk) + " keeps its items in an Arrow table (litdata.optimize writes one for dict "
                           "items of plain JSON values when pyarrow is installed), which this reader does not read; "
                           "write the dataset where pyarrow is not installed, or with a tensor or bytes field");
      }
      if (size < 4) damaged("it is shorter than its header");
      uint32_t n;
      std::memcpy(&n, data, 4);
      if (n != chunk.items)
        damaged("its header counts " + std::to_string(n) + " items, index.json says " + std::to_string(chunk.items) +
                " (the index does not match the chunk)");
      const size_t table_end = 4 + 4 * (size_t{n} + 1);
      if (size < table_end) damaged("it is shorter than its offset table");
      uint32_t first, last;
      std::memcpy(&first, data + 4, 4);
      std::memcpy(&last, data + 4 + 4 * size_t{n}, 4);
      if (first != table_end || last > size || last < first)
        damaged("its offset table points outside the file (first " + std::to_string(first) + ", last " +
                std::to_string(last) + ", size " + std::to_string(size) + ")");
      chunk.data = data;
      chunk.size = size;
    });
    LF_CHECK(chunk.data != nullptr || chunk.items == 0, RuntimeError, where(chunk), " could not be opened earlier");
    return chunk;
  }

  std::pair<size_t, int64_t> locate(int64_t index) const {
    LF_CHECK(index >= 0 && index < items, ValueError, "StreamingDataset(", dir.string(), ").get(", index,
             "): the index is out of range; the dataset has ", items, " items (0 to ", items - 1, ")");
    const size_t c = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), index) - starts.begin()) - 1;
    return {c, index - starts[c]};
  }

  std::pair<const uint8_t*, size_t> payload(int64_t index) const {
    const auto [c, local] = locate(index);
    const Chunk& chunk = open(c);
    uint32_t begin, end;
    std::memcpy(&begin, chunk.data + 4 + 4 * local, 4);
    std::memcpy(&end, chunk.data + 8 + 4 * local, 4);
    LF_CHECK(begin <= end && end <= chunk.size, RuntimeError, where(chunk), " is damaged: item ", local,
             " lies outside the file. Copy the dataset folder again, or write the dataset again");
    return {chunk.data + begin, end - begin};
  }
};

namespace {

json read_json(const std::filesystem::path& path, const std::string& who) {
  std::ifstream in(path);
  LF_CHECK(in, ValueError, who, ": cannot read ", path.string());
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    throw ValueError(who + ": " + path.string() + " is not valid JSON (" + e.what() +
                     "); it is damaged or still being written: write the dataset again");
  }
}

// index.json, or the per-writer {rank}.index.json files merged in rank order (as LitData does).
json read_index(const std::filesystem::path& dir, const std::string& who) {
  LF_CHECK(std::filesystem::is_directory(dir), ValueError, who, ": ", dir.string(),
           " is not a folder; pass the folder that holds index.json and the chunk files");
  if (std::filesystem::exists(dir / "index.json")) return read_json(dir / "index.json", who);
  auto [merged, parts] = merge_writer_indexes(dir, who);
  LF_CHECK(!parts.empty(), ValueError, who, ": ", dir.string(),
           " has no index.json; it is not a dataset written by litdata.optimize or lf::StreamingWriter, or its "
           "writer did not finish");
  return merged;
}

}  // namespace
}  // namespace data_detail

StreamingDataset::StreamingDataset(const std::filesystem::path& dir) : files_(std::make_unique<data_detail::DatasetFiles>()) {
  using nlohmann::json;
  auto& files = *files_;
  files.dir = dir;
  const std::string who = "StreamingDataset(" + dir.string() + ")";
  const json index = data_detail::read_index(dir, who);
  try {
    const json& config = index.at("config");
    const std::string loader = config.value("item_loader", std::string("PyTreeLoader"));
    LF_CHECK(loader == "PyTreeLoader", ValueError, who, ": items written with LitData's ", loader,
             ", which this reader does not read (it reads PyTreeLoader datasets, litdata.optimize's default)");
    LF_CHECK(config.at("compression").is_null(), ValueError, who, ": the dataset is compressed (compression=",
             config.at("compression").dump(), "), which this reader does not decompress; write it without compression");
    LF_CHECK(!config.contains("encryption") || config.at("encryption").is_null(), ValueError, who,
             ": the dataset is encrypted, which this reader does not decrypt; write it without encryption");
    for (const auto& format : config.at("data_format")) {
      files.data_format.push_back(format.get<std::string>());
      try {  // refused when the dataset opens, not at the first item a background thread reads
        data_detail::check_readable_format(files.data_format.back());
      } catch (const std::runtime_error& e) {
        throw ValueError(who + ": " + e.what() + "; write that field in a readable format");
      }
    }
    LF_CHECK(config.at("data_spec").is_string(), ValueError, who, ": index.json has no data_spec");
    files.spec = data_detail::parse_tree_spec(config.at("data_spec").get<std::string>());
    LF_CHECK(files.spec.leaves() == files.data_format.size(), ValueError, who, ": index.json's data_spec has ",
             files.spec.leaves(), " leaves but data_format lists ", files.data_format.size(),
             "; the index is damaged: write the dataset again");
    for (const auto& entry : index.at("chunks")) {
      auto chunk = std::make_unique<data_detail::Chunk>();
      chunk->filename = entry.at("filename").get<std::string>();
      chunk->items = entry.at("chunk_size").get<int64_t>();
      chunk->bytes = entry.at("chunk_bytes").get<int64_t>();
      LF_CHECK(chunk->filename.find('/') == std::string::npos && chunk->items >= 0, ValueError, who,
               ": index.json lists a bad chunk entry ", entry.dump());
      const auto path = dir / chunk->filename;
      LF_CHECK(std::filesystem::exists(path), ValueError, who, ": chunk ", chunk->filename,
               " listed in index.json is missing. Copy the whole dataset folder again, or write the dataset again");
      const auto size = static_cast<int64_t>(std::filesystem::file_size(path));
      LF_CHECK(size >= chunk->bytes, ValueError, who, ": chunk ", chunk->filename, " has ", size,
               " bytes, index.json says ", chunk->bytes,
               " (truncated, or the index does not match the chunks). Copy the dataset folder again, or write it again");
      files.starts.push_back(files.items);
      files.chunk_sizes.push_back(chunk->items);
      files.items += chunk->items;
      files.chunks.push_back(std::move(chunk));
    }
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(who + ": index.json lacks a field LitData writes (" + e.what() + "); write the dataset again");
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const Error*>(&e)) throw;
    throw ValueError(who + ": index.json: " + e.what());
  }
}

StreamingDataset::~StreamingDataset() = default;

int64_t StreamingDataset::size() const { return files_->items; }
const std::vector<int64_t>& StreamingDataset::chunk_sizes() const { return files_->chunk_sizes; }
const std::vector<std::string>& StreamingDataset::data_format() const { return files_->data_format; }
const std::filesystem::path& StreamingDataset::dir() const { return files_->dir; }

std::string StreamingDataset::raw(int64_t index) const {
  const auto [data, size] = files_->payload(index);
  return std::string(reinterpret_cast<const char*>(data), size);
}

c10::IValue StreamingDataset::get(int64_t index) const {
  const auto& files = *files_;
  const auto [data, size] = files.payload(index);
  const size_t leaves = files.data_format.size();
  auto damaged = [&](const std::string& why) {
    const auto [c, local] = files.locate(index);
    return RuntimeError(files.where(*files.chunks[c]) + ", item " + std::to_string(local) + " (global " +
                        std::to_string(index) + "): " + why);
  };
  if (size < 4 * leaves) throw damaged("the item is shorter than its leaf sizes; the chunk is damaged");
  std::vector<c10::IValue> values;
  values.reserve(leaves);
  size_t offset = 4 * leaves;
  for (size_t leaf = 0; leaf < leaves; ++leaf) {
    uint32_t length;
    std::memcpy(&length, data + 4 * leaf, 4);
    if (offset + length > size) throw damaged("leaf " + std::to_string(leaf) + " runs past the item; the chunk is damaged");
    try {
      values.push_back(data_detail::decode_leaf(files.data_format[leaf], data + offset, length));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw damaged("leaf " + std::to_string(leaf) + " (" + files.data_format[leaf] + "): " + e.what());
    }
    offset += length;
  }
  return data_detail::unflatten(files.spec, values);
}

}  // namespace lightning::fabric
