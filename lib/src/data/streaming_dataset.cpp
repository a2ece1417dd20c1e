#include "lightning/fabric/data/streaming_dataset.h"

#include "lightning/fabric/data/litdata_format.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/storage/s3_client.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>

namespace lightning::fabric {

namespace data_detail {

namespace {
using json = nlohmann::json;
constexpr char kArrowFooterMagic[8] = {'L', 'D', 'A', 'R', 'W', '0', '1', '\0'};
constexpr char kFramedMagic[8] = {'L', 'D', 'F', 'Z', '0', '1', '\0', '\0'};
}  // namespace

/// How the chunks of a dataset are compressed (index.json's compression and compression_level).
enum class Compression { None, WholeFile, Framed, PerItem };

/// One chunk file, mapped whole when first read (compressed whole: the compressed file is mapped,
/// and its content inflated into memory while it is read, DatasetFiles::whole_chunk).
struct Chunk {
  std::string filename;
  int64_t items = 0;
  int64_t bytes = 0;
  std::once_flag mapped;
  const uint8_t* data = nullptr;
  size_t size = 0;
  bool owns_mapping = false;
  // A framed chunk (LDFZ01): items' offsets into their frames' concatenation, and the frames.
  bool framed = false;
  uint32_t frame_rows = 0;
  const uint8_t* logical_offsets = nullptr;  // u32[items + 1]
  struct Frame {
    uint32_t first = 0, items = 0, compressed_size = 0, size = 0;
    uint64_t offset = 0;
  };
  std::vector<Frame> frames;
  ~Chunk() {
    if (owns_mapping && data) munmap(const_cast<uint8_t*>(data), size);
  }
};

/// An item's bytes, and what keeps them alive when they were inflated.
struct Payload {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const std::string> keep;
};

struct DatasetFiles {
  std::filesystem::path origin;  // as given: a folder, or an s3:// URL
  std::filesystem::path dir;     // the local folder read: origin, or the local cache of an s3:// dataset
  // An s3:// dataset: where its objects are, and the client that downloads a chunk into dir on its
  // first read (by the loader's reading threads, so ahead of the loop).
  std::optional<storage::S3Url> remote;
  std::optional<storage::S3Client> client;
  std::vector<std::unique_ptr<Chunk>> chunks;
  std::vector<int64_t> chunk_sizes;
  std::vector<int64_t> starts;  // global index of each chunk's first item
  int64_t items = 0;
  std::vector<std::string> data_format;
  TreeSpec spec;
  Compression compression = Compression::None;
  // Recently inflated frames of framed chunks, shared by the reading threads (items of one frame
  // are read close together).
  struct CachedFrame {
    size_t chunk, frame;
    std::shared_ptr<const std::string> bytes;
  };
  mutable std::mutex cache_mutex;
  mutable std::deque<CachedFrame> cache;
  static constexpr size_t kCachedFrames = 16;
  // The most recently read whole-file-compressed chunks, inflated (a reading thread works through
  // one chunk at a time): at most kInflatedChunks of them stay in memory, not every chunk read.
  struct InflatedChunk {
    size_t chunk;
    std::shared_ptr<const std::string> bytes;
  };
  mutable std::deque<InflatedChunk> inflated_chunks;
  static constexpr size_t kInflatedChunks = 4;

  std::string where(const Chunk& chunk) const {
    return "StreamingDataset(" + origin.string() + "): chunk " + chunk.filename;
  }

  [[noreturn]] void damaged(const Chunk& chunk, const std::string& why) const {
    throw RuntimeError(where(chunk) + " is damaged: " + why + ". Copy the dataset folder again, or write the dataset again");
  }

  void read_framed_header(Chunk& chunk) const {
    const uint8_t* data = chunk.data;
    const size_t size = chunk.size;
    if (size < 24) damaged(chunk, "it is shorter than its framed header");
    uint16_t version;
    uint32_t n, rows, frames;
    std::memcpy(&version, data + 8, 2);
    std::memcpy(&n, data + 12, 4);
    std::memcpy(&rows, data + 16, 4);
    std::memcpy(&frames, data + 20, 4);
    if (version != 1) damaged(chunk, "its framed header has version " + std::to_string(version) + " (this reader reads 1)");
    if (n != chunk.items)
      damaged(chunk, "its header counts " + std::to_string(n) + " items, index.json says " + std::to_string(chunk.items) +
                         " (the index does not match the chunk)");
    if (n == 0 || rows == 0 || frames != (n + rows - 1) / rows) damaged(chunk, "its framed header is inconsistent");
    const size_t offsets_end = 24 + 4 * (size_t{n} + 1);
    const size_t table_end = offsets_end + 24 * size_t{frames};
    if (size < table_end) damaged(chunk, "it is shorter than its offset and frame tables");
    chunk.framed = true;
    chunk.frame_rows = rows;
    chunk.logical_offsets = data + 24;
    for (uint32_t f = 0; f < frames; ++f) {
      const uint8_t* entry = data + offsets_end + 24 * size_t{f};
      Chunk::Frame frame;
      std::memcpy(&frame.first, entry, 4);
      std::memcpy(&frame.items, entry + 4, 4);
      std::memcpy(&frame.offset, entry + 8, 8);
      std::memcpy(&frame.compressed_size, entry + 16, 4);
      std::memcpy(&frame.size, entry + 20, 4);
      if (frame.first != f * rows || frame.items == 0 || frame.first + frame.items > n || frame.compressed_size == 0 ||
          frame.offset < table_end || frame.offset + frame.compressed_size > size)
        damaged(chunk, "its frame table is invalid or points outside the file");
      uint32_t begin, end;
      std::memcpy(&begin, chunk.logical_offsets + 4 * size_t{frame.first}, 4);
      std::memcpy(&end, chunk.logical_offsets + 4 * (size_t{frame.first} + frame.items), 4);
      if (end < begin || end - begin != frame.size) damaged(chunk, "its offsets do not match frame " + std::to_string(f));
      chunk.frames.push_back(frame);
    }
  }

  void read_plain_header(const Chunk& chunk) const {
    const uint8_t* data = chunk.data;
    const size_t size = chunk.size;
    if (size < 4) damaged(chunk, "it is shorter than its header");
    uint32_t n;
    std::memcpy(&n, data, 4);
    if (n != chunk.items)
      damaged(chunk, "its header counts " + std::to_string(n) + " items, index.json says " + std::to_string(chunk.items) +
                         " (the index does not match the chunk)");
    const size_t table_end = 4 + 4 * (size_t{n} + 1);
    if (size < table_end) damaged(chunk, "it is shorter than its offset table");
    uint32_t first, last;
    std::memcpy(&first, data + 4, 4);
    std::memcpy(&last, data + 4 + 4 * size_t{n}, 4);
    if (first != table_end || last > size || last < first)
      damaged(chunk, "its offset table points outside the file (first " + std::to_string(first) + ", last " +
                         std::to_string(last) + ", size " + std::to_string(size) + ")");
  }

  // Maps the chunk and checks its header against the index (once).
  const Chunk& open(size_t c) const {
    Chunk& chunk = *chunks[c];
    std::call_once(chunk.mapped, [&] {
      const auto path = dir / chunk.filename;
      if (remote && !std::filesystem::exists(path)) client->get_to_file(remote->child(chunk.filename), path);
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      LF_CHECK(fd >= 0, RuntimeError, where(chunk), " cannot be opened: ", std::strerror(errno),
               ". The folder lacks a chunk that index.json lists: copy the whole dataset folder again, or write it again");
      struct stat info {};
      fstat(fd, &info);
      const size_t size = static_cast<size_t>(info.st_size);
      void* mapping = size ? mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
      ::close(fd);
      LF_CHECK(size == 0 || mapping != MAP_FAILED, RuntimeError, where(chunk), " cannot be mapped: ", std::strerror(errno));
      chunk.data = static_cast<const uint8_t*>(size ? mapping : nullptr);
      chunk.size = size;
      chunk.owns_mapping = true;
      const uint8_t* compressed = chunk.data;
      const size_t compressed_size = chunk.size;
      try {
        if (compression == Compression::WholeFile) {  // the file is zstd(chunk); index.json counts the chunk's bytes
          const auto inflated = inflate_whole(chunk);
          remember_inflated(c, inflated);
          chunk.data = reinterpret_cast<const uint8_t*>(inflated->data());  // checked below, then the mapping again
          chunk.size = inflated->size();
        }
        if (static_cast<int64_t>(chunk.size) < chunk.bytes)
          damaged(chunk, "it has " + std::to_string(chunk.size) + " bytes, index.json says " + std::to_string(chunk.bytes));
        if (chunk.size >= 8 && std::memcmp(chunk.data + chunk.size - 8, kArrowFooterMagic, 8) == 0)
          throw RuntimeError(where(chunk) + " keeps its items in an Arrow table (litdata.optimize writes one for dict "
                             "items of plain JSON values when pyarrow is installed), which this reader does not read; "
                             "write the dataset where pyarrow is not installed, or with a tensor or bytes field");
        const bool magic = chunk.size >= 8 && std::memcmp(chunk.data, kFramedMagic, 8) == 0;
        if (compression == Compression::Framed && !magic)
          damaged(chunk, "index.json says its items are compressed in frames (compression_level \"batch\"), but it has "
                         "no framed header");
        if (compression == Compression::WholeFile && magic)
          damaged(chunk, "it is compressed whole and holds a framed chunk inside; litdata.optimize writes neither");
        if (magic) read_framed_header(chunk);
        else read_plain_header(chunk);
        if (compression == Compression::WholeFile) chunk.data = compressed, chunk.size = compressed_size;
      } catch (const std::runtime_error& e) {
        if (compressed) munmap(const_cast<uint8_t*>(compressed), compressed_size);
        chunk.data = nullptr;  // call_once runs again on the next read
        chunk.size = 0;
        chunk.owns_mapping = chunk.framed = false;
        forget_inflated(c);
        chunk.frames.clear();
        if (dynamic_cast<const Error*>(&e)) throw;
        throw RuntimeError(where(*chunks[c]) + ": " + e.what());
      }
    });
    LF_CHECK(chunk.data != nullptr || chunk.items == 0, RuntimeError, where(chunk), " could not be opened earlier");
    return chunk;
  }

  // A whole-file-compressed chunk's content, inflated from its mapped compressed file.
  std::shared_ptr<const std::string> inflate_whole(const Chunk& chunk) const {
    try {
      return std::make_shared<const std::string>(zstd_inflate(chunk.data, chunk.size, static_cast<size_t>(chunk.bytes)));
    } catch (const std::runtime_error& e) {
      damaged(chunk, std::string("it does not inflate as index.json's compression says (") + e.what() + ")");
    }
  }
  void remember_inflated(size_t c, std::shared_ptr<const std::string> bytes) const {
    std::lock_guard<std::mutex> lock(cache_mutex);
    inflated_chunks.push_back({c, std::move(bytes)});
    if (inflated_chunks.size() > kInflatedChunks) inflated_chunks.pop_front();
  }
  void forget_inflated(size_t c) const {
    std::lock_guard<std::mutex> lock(cache_mutex);
    inflated_chunks.erase(std::remove_if(inflated_chunks.begin(), inflated_chunks.end(),
                                         [c](const InflatedChunk& each) { return each.chunk == c; }),
                          inflated_chunks.end());
  }
  /// A whole-file-compressed chunk's content: from the recent ones, else inflated again (two
  /// threads may inflate the same chunk at once; both copies are equal).
  std::shared_ptr<const std::string> whole_chunk(size_t c, const Chunk& chunk) const {
    {
      std::lock_guard<std::mutex> lock(cache_mutex);
      for (auto it = inflated_chunks.begin(); it != inflated_chunks.end(); ++it) {
        if (it->chunk != c) continue;
        auto bytes = it->bytes;
        if (std::next(it) != inflated_chunks.end()) {  // the most recent last
          inflated_chunks.erase(it);
          inflated_chunks.push_back({c, bytes});
        }
        return bytes;
      }
    }
    auto bytes = inflate_whole(chunk);
    if (static_cast<int64_t>(bytes->size()) < chunk.bytes)
      damaged(chunk, "it inflates to " + std::to_string(bytes->size()) + " bytes, index.json says " + std::to_string(chunk.bytes));
    remember_inflated(c, bytes);
    return bytes;
  }

  std::pair<size_t, int64_t> locate(int64_t index) const {
    LF_CHECK(index >= 0 && index < items, ValueError, "StreamingDataset(", origin.string(), ").get(", index,
             "): the index is out of range; the dataset has ", items, " items (0 to ", items - 1, ")");
    const size_t c = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), index) - starts.begin()) - 1;
    return {c, index - starts[c]};
  }

  std::shared_ptr<const std::string> frame_bytes(size_t c, const Chunk& chunk, size_t f) const {
    {
      std::lock_guard<std::mutex> lock(cache_mutex);
      for (const auto& cached : cache)
        if (cached.chunk == c && cached.frame == f) return cached.bytes;
    }
    const Chunk::Frame& frame = chunk.frames[f];
    std::shared_ptr<const std::string> bytes;
    try {
      bytes = std::make_shared<const std::string>(zstd_inflate(chunk.data + frame.offset, frame.compressed_size, frame.size));
    } catch (const std::runtime_error& e) {
      damaged(chunk, "frame " + std::to_string(f) + ": " + e.what());
    }
    if (bytes->size() != frame.size)
      damaged(chunk, "frame " + std::to_string(f) + " inflates to " + std::to_string(bytes->size()) + " bytes, its table says " +
                         std::to_string(frame.size));
    std::lock_guard<std::mutex> lock(cache_mutex);
    cache.push_back({c, f, bytes});
    if (cache.size() > kCachedFrames) cache.pop_front();
    return bytes;
  }

  Payload payload(int64_t index) const {
    const auto [c, local] = locate(index);
    const Chunk& chunk = open(c);
    if (chunk.framed) {
      const size_t f = static_cast<size_t>(local) / chunk.frame_rows;
      const Chunk::Frame& frame = chunk.frames[f];
      uint32_t frame_begin, begin, end;
      std::memcpy(&frame_begin, chunk.logical_offsets + 4 * size_t{frame.first}, 4);
      std::memcpy(&begin, chunk.logical_offsets + 4 * static_cast<size_t>(local), 4);
      std::memcpy(&end, chunk.logical_offsets + 4 * static_cast<size_t>(local + 1), 4);
      if (begin < frame_begin || end < begin || end - frame_begin > frame.size)
        damaged(chunk, "item " + std::to_string(local) + " lies outside its frame");
      auto bytes = frame_bytes(c, chunk, f);
      return {reinterpret_cast<const uint8_t*>(bytes->data()) + (begin - frame_begin), end - begin, bytes};
    }
    std::shared_ptr<const std::string> whole;  // a whole-file-compressed chunk's content
    if (compression == Compression::WholeFile) whole = whole_chunk(c, chunk);
    const uint8_t* data = whole ? reinterpret_cast<const uint8_t*>(whole->data()) : chunk.data;
    const size_t size = whole ? whole->size() : chunk.size;
    uint32_t begin, end;
    std::memcpy(&begin, data + 4 + 4 * local, 4);
    std::memcpy(&end, data + 8 + 4 * local, 4);
    LF_CHECK(begin <= end && end <= size, RuntimeError, where(chunk), " is damaged: item ", local,
             " lies outside the file. Copy the dataset folder again, or write the dataset again");
    if (whole) return {data + begin, end - begin, whole};
    if (compression == Compression::PerItem) {  // each item its own zstd frame
      std::shared_ptr<const std::string> bytes;
      try {
        bytes = std::make_shared<const std::string>(zstd_inflate(chunk.data + begin, end - begin, 0));
      } catch (const std::runtime_error& e) {
        damaged(chunk, "item " + std::to_string(local) + ": " + e.what());
      }
      return {reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(), bytes};
    }
    return {chunk.data + begin, end - begin, nullptr};
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

namespace {

// The local folder an s3:// dataset's objects are downloaded to: LT_STREAMING_CACHE_DIR, else
// $XDG_CACHE_HOME (or ~/.cache)/lightning-fabric/streaming, one folder per endpoint and URL.
std::filesystem::path remote_cache_dir(const storage::S3Client& client, const storage::S3Url& url) {
  std::filesystem::path root;
  if (const char* set = std::getenv("LT_STREAMING_CACHE_DIR"); set && *set) {
    root = set;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    root = std::filesystem::path(xdg) / "lightning-fabric" / "streaming";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    root = std::filesystem::path(home) / ".cache" / "lightning-fabric" / "streaming";
  } else {
    root = std::filesystem::temp_directory_path() / "lightning-fabric-streaming";
  }
  std::string name = url.bucket + "-" + url.key;
  for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016zx", std::hash<std::string>()(client.endpoint() + "|" + url.str()));
  return root / (name.substr(0, 80) + "-" + hash);
}

}  // namespace

StreamingDataset::StreamingDataset(const std::filesystem::path& dir) : files_(std::make_unique<data_detail::DatasetFiles>()) {
  using nlohmann::json;
  auto& files = *files_;
  files.origin = files.dir = dir;
  const std::string who = "StreamingDataset(" + dir.string() + ")";
  std::map<std::string, int64_t> remote_sizes;  // an s3:// dataset's objects under its prefix
  if (storage::S3Url::is_s3(dir.string())) {
    files.remote = storage::S3Url::parse(dir.string(), who);
    files.client = storage::S3Client::from_environment(who);
    files.dir = remote_cache_dir(*files.client, *files.remote);
    std::filesystem::create_directories(files.dir);
    try {
      remote_sizes = files.client->list_folder(*files.remote);
    } catch (const RuntimeError& e) {
      throw RuntimeError(who + ": " + e.what());
    }
    LF_CHECK(remote_sizes.count("index.json") > 0, ValueError, who, ": there is no index.json under ", dir.string(),
             " (", remote_sizes.size(), " objects there); it is not a dataset written by litdata.optimize or "
             "lf::StreamingWriter, or its writer did not finish");
    files.client->get_to_file(files.remote->child("index.json"), files.dir / "index.json");  // always the current one
  }
  const json index = data_detail::read_index(files.dir, who);
  try {
    const json& config = index.at("config");
    const std::string loader = config.value("item_loader", std::string("PyTreeLoader"));
    LF_CHECK(loader == "PyTreeLoader", ValueError, who, ": items written with LitData's ", loader,
             ", which this reader does not read (it reads PyTreeLoader datasets, litdata.optimize's default)");
    const json& compression = config.at("compression");
    if (!compression.is_null()) {
      const std::string name = compression.get<std::string>();
      LF_CHECK(name.rfind("zstd", 0) == 0, ValueError, who, ": compression=\"", name,
               "\" is not one LitData offers or this reader reads (zstd, zstd:LEVEL)");
      const json level = config.value("compression_level", json());
      const std::string granularity = level.is_null() ? "chunk" : level.get<std::string>();
      if (granularity == "chunk") files.compression = data_detail::Compression::WholeFile;
      else if (granularity == "batch") files.compression = data_detail::Compression::Framed;
      else if (granularity == "sample") files.compression = data_detail::Compression::PerItem;
      else throw ValueError(who + ": compression_level \"" + granularity + "\" is not chunk, batch or sample");
      LF_CHECK(data_detail::zstd_available(), ValueError, who, ": the dataset is zstd-compressed and this build of "
               "lightning_fabric has no zstd (libzstd was not found when it was built; Debian: libzstd-dev)");
    }
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
      const auto path = files.dir / chunk->filename;
      const auto listed = remote_sizes.find(chunk->filename);
      LF_CHECK(files.remote ? listed != remote_sizes.end() : std::filesystem::exists(path), ValueError, who, ": chunk ",
               chunk->filename, " listed in index.json is missing. Copy the whole dataset folder again, or write the "
               "dataset again");
      const auto size = files.remote ? listed->second : static_cast<int64_t>(std::filesystem::file_size(path));
      LF_CHECK(size >= chunk->bytes || files.compression == data_detail::Compression::WholeFile, ValueError, who, ": chunk ", chunk->filename, " has ", size,
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
const std::filesystem::path& StreamingDataset::dir() const { return files_->origin; }

std::string StreamingDataset::raw(int64_t index) const {
  const auto item = files_->payload(index);
  return std::string(reinterpret_cast<const char*>(item.data), item.size);
}

c10::IValue StreamingDataset::get(int64_t index) const {
  const auto& files = *files_;
  const auto item = files.payload(index);  // item.keep holds inflated bytes while they are decoded
  const uint8_t* data = item.data;
  const size_t size = item.size;
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
