#include "lightning/fabric/data/streaming_dataset.h"

#include "lightning/fabric/data/chunk_cache.h"
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

/// One chunk file as index.json lists it, and its mapping while open (OpenChunk).
struct OpenChunk;
struct Chunk {
  std::string filename;
  int64_t items = 0;
  int64_t bytes = 0;         // index.json's chunk_bytes: the chunk's bytes, inflated
  int64_t remote_bytes = 0;  // an s3:// dataset's object size (what the cache holds)
  std::mutex opening;
  std::weak_ptr<OpenChunk> open;      // while anything reads it
  std::shared_ptr<OpenChunk> pinned;  // a local chunk stays mapped for the dataset's life
};

/// A chunk file mapped whole (compressed whole: the compressed file is mapped, and its content
/// inflated into memory while it is read, DatasetFiles::whole_chunk). An s3:// chunk is held in the
/// node's cache while open; closing unmaps it, so an evicted chunk frees its disk space.
struct OpenChunk {
  const uint8_t* data = nullptr;
  size_t size = 0;
  // A framed chunk (LDFZ01): items' offsets into their frames' concatenation, and the frames.
  bool framed = false;
  uint32_t frame_rows = 0;
  const uint8_t* logical_offsets = nullptr;  // u32[items + 1]
  struct Frame {
    uint32_t first = 0, items = 0, compressed_size = 0, size = 0;
    uint64_t offset = 0;
  };
  std::vector<Frame> frames;
  std::shared_ptr<ChunkCache::Hold> held;
  ~OpenChunk() {
    if (data) munmap(const_cast<uint8_t*>(data), size);
  }
};

/// An item's bytes, and what keeps them alive when they were inflated.
struct Payload {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> keep;
};

struct DatasetFiles {
  std::filesystem::path origin;  // as given: a folder, or an s3:// URL
  std::filesystem::path dir;     // the local folder read: origin, or the local cache of an s3:// dataset
  // An s3:// dataset: the node's cache its chunks are downloaded into (docs/data.md, "The cache").
  mutable std::optional<ChunkCache> cache;
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
  mutable std::deque<CachedFrame> cache_frames;
  static constexpr size_t kCachedFrames = 16;
  // The most recently read whole-file-compressed chunks, inflated (a reading thread works through
  // one chunk at a time): at most kInflatedChunks of them stay in memory, not every chunk read.
  struct InflatedChunk {
    size_t chunk;
    std::shared_ptr<const std::string> bytes;
  };
  mutable std::deque<InflatedChunk> inflated_chunks;
  static constexpr size_t kInflatedChunks = 4;
  // An s3:// dataset's recently opened chunks, kept open between items (a loader's reading
  // threads work through a chunk at a time); dropped when the cache needs their room.
  mutable std::deque<std::shared_ptr<OpenChunk>> recent;
  static constexpr size_t kRecentChunks = 4;

  std::string where(const Chunk& chunk) const {
    return "StreamingDataset(" + origin.string() + "): chunk " + chunk.filename;
  }

  [[noreturn]] void damaged(const Chunk& chunk, const std::string& why) const {
    throw RuntimeError(where(chunk) + " is damaged: " + why + ". Copy the dataset folder again, or write the dataset again");
  }

  void read_framed_header(const Chunk& chunk, OpenChunk& open) const {
    const uint8_t* data = open.data;
    const size_t size = open.size;
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
    open.framed = true;
    open.frame_rows = rows;
    open.logical_offsets = data + 24;
    for (uint32_t f = 0; f < frames; ++f) {
      const uint8_t* entry = data + offsets_end + 24 * size_t{f};
      OpenChunk::Frame frame;
      std::memcpy(&frame.first, entry, 4);
      std::memcpy(&frame.items, entry + 4, 4);
      std::memcpy(&frame.offset, entry + 8, 8);
      std::memcpy(&frame.compressed_size, entry + 16, 4);
      std::memcpy(&frame.size, entry + 20, 4);
      if (frame.first != f * rows || frame.items == 0 || frame.first + frame.items > n || frame.compressed_size == 0 ||
          frame.offset < table_end || frame.offset + frame.compressed_size > size)
        damaged(chunk, "its frame table is invalid or points outside the file");
      uint32_t begin, end;
      std::memcpy(&begin, open.logical_offsets + 4 * size_t{frame.first}, 4);
      std::memcpy(&end, open.logical_offsets + 4 * (size_t{frame.first} + frame.items), 4);
      if (end < begin || end - begin != frame.size) damaged(chunk, "its offsets do not match frame " + std::to_string(f));
      open.frames.push_back(frame);
    }
  }

  void read_plain_header(const Chunk& chunk, const uint8_t* data, size_t size) const {
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

  /// Drops this process's idle open s3:// chunks, so the cache may evict them.
  void release_recent() const {
    std::lock_guard<std::mutex> lock(cache_mutex);
    recent.clear();
  }

  /// Holds chunk c of an s3:// dataset in the node's cache for reading (downloaded if absent).
  std::shared_ptr<ChunkCache::Hold> hold(size_t c) const {
    const Chunk& chunk = *chunks[c];
    return cache->hold(chunk.filename, chunk.remote_bytes, [this] { release_recent(); });
  }

  // The chunk mapped, its header checked against the index: the open one, else opened now.
  std::shared_ptr<const OpenChunk> open(size_t c) const {
    Chunk& chunk = *chunks[c];
    std::lock_guard<std::mutex> opening(chunk.opening);
    if (auto live = chunk.open.lock()) return live;
    auto open = std::make_shared<OpenChunk>();
    if (cache) open->held = hold(c);
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
    open->data = static_cast<const uint8_t*>(size ? mapping : nullptr);
    open->size = size;
    try {
      const uint8_t* data = open->data;
      size_t length = open->size;
      std::shared_ptr<const std::string> inflated;
      if (compression == Compression::WholeFile) {  // the file is zstd(chunk); index.json counts the chunk's bytes
        inflated = inflate_whole(chunk, *open);
        data = reinterpret_cast<const uint8_t*>(inflated->data());
        length = inflated->size();
      }
      if (static_cast<int64_t>(length) < chunk.bytes)
        damaged(chunk, "it has " + std::to_string(length) + " bytes, index.json says " + std::to_string(chunk.bytes));
      if (length >= 8 && std::memcmp(data + length - 8, kArrowFooterMagic, 8) == 0)
        throw RuntimeError(where(chunk) + " keeps its items in an Arrow table (litdata.optimize writes one for dict "
                           "items of plain JSON values when pyarrow is installed), which this reader does not read; "
                           "write the dataset where pyarrow is not installed, or with a tensor or bytes field");
      const bool magic = length >= 8 && std::memcmp(data, kFramedMagic, 8) == 0;
      if (compression == Compression::Framed && !magic)
        damaged(chunk, "index.json says its items are compressed in frames (compression_level \"batch\"), but it has "
                       "no framed header");
      if (compression == Compression::WholeFile && magic)
        damaged(chunk, "it is compressed whole and holds a framed chunk inside; litdata.optimize writes neither");
      if (magic) read_framed_header(chunk, *open);
      else read_plain_header(chunk, data, length);
      if (inflated) remember_inflated(c, inflated);
    } catch (const std::runtime_error& e) {
      if (dynamic_cast<const Error*>(&e)) throw;
      throw RuntimeError(where(chunk) + ": " + e.what());
    }
    chunk.open = open;
    if (cache) {
      std::lock_guard<std::mutex> lock(cache_mutex);
      recent.push_back(open);
      if (recent.size() > kRecentChunks) recent.pop_front();
    } else {
      chunk.pinned = open;
    }
    return open;
  }

  // A whole-file-compressed chunk's content, inflated from its mapped compressed file.
  std::shared_ptr<const std::string> inflate_whole(const Chunk& chunk, const OpenChunk& open) const {
    try {
      return std::make_shared<const std::string>(zstd_inflate(open.data, open.size, static_cast<size_t>(chunk.bytes)));
    } catch (const std::runtime_error& e) {
      damaged(chunk, std::string("it does not inflate as index.json's compression says (") + e.what() + ")");
    }
  }
  void remember_inflated(size_t c, std::shared_ptr<const std::string> bytes) const {
    std::lock_guard<std::mutex> lock(cache_mutex);
    inflated_chunks.push_back({c, std::move(bytes)});
    if (inflated_chunks.size() > kInflatedChunks) inflated_chunks.pop_front();
  }
  /// A whole-file-compressed chunk's content: from the recent ones, else inflated again (two
  /// threads may inflate the same chunk at once; both copies are equal).
  std::shared_ptr<const std::string> whole_chunk(size_t c, const OpenChunk& open) const {
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
    const Chunk& chunk = *chunks[c];
    auto bytes = inflate_whole(chunk, open);
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

  std::shared_ptr<const std::string> frame_bytes(size_t c, const OpenChunk& open, size_t f) const {
    {
      std::lock_guard<std::mutex> lock(cache_mutex);
      for (const auto& cached : cache_frames)
        if (cached.chunk == c && cached.frame == f) return cached.bytes;
    }
    const Chunk& chunk = *chunks[c];
    const OpenChunk::Frame& frame = open.frames[f];
    std::shared_ptr<const std::string> bytes;
    try {
      bytes = std::make_shared<const std::string>(zstd_inflate(open.data + frame.offset, frame.compressed_size, frame.size));
    } catch (const std::runtime_error& e) {
      damaged(chunk, "frame " + std::to_string(f) + ": " + e.what());
    }
    if (bytes->size() != frame.size)
      damaged(chunk, "frame " + std::to_string(f) + " inflates to " + std::to_string(bytes->size()) + " bytes, its table says " +
                         std::to_string(frame.size));
    std::lock_guard<std::mutex> lock(cache_mutex);
    cache_frames.push_back({c, f, bytes});
    if (cache_frames.size() > kCachedFrames) cache_frames.pop_front();
    return bytes;
  }

  Payload payload(int64_t index) const {
    const auto [c, local] = locate(index);
    const Chunk& chunk = *chunks[c];
    const auto open = this->open(c);
    if (open->framed) {
      const size_t f = static_cast<size_t>(local) / open->frame_rows;
      const OpenChunk::Frame& frame = open->frames[f];
      uint32_t frame_begin, begin, end;
      std::memcpy(&frame_begin, open->logical_offsets + 4 * size_t{frame.first}, 4);
      std::memcpy(&begin, open->logical_offsets + 4 * static_cast<size_t>(local), 4);
      std::memcpy(&end, open->logical_offsets + 4 * static_cast<size_t>(local + 1), 4);
      if (begin < frame_begin || end < begin || end - frame_begin > frame.size)
        damaged(chunk, "item " + std::to_string(local) + " lies outside its frame");
      auto bytes = frame_bytes(c, *open, f);
      return {reinterpret_cast<const uint8_t*>(bytes->data()) + (begin - frame_begin), end - begin, bytes};
    }
    std::shared_ptr<const std::string> whole;  // a whole-file-compressed chunk's content
    if (compression == Compression::WholeFile) whole = whole_chunk(c, *open);
    const uint8_t* data = whole ? reinterpret_cast<const uint8_t*>(whole->data()) : open->data;
    const size_t size = whole ? whole->size() : open->size;
    uint32_t begin, end;
    std::memcpy(&begin, data + 4 + 4 * local, 4);
    std::memcpy(&end, data + 8 + 4 * local, 4);
    LF_CHECK(begin <= end && end <= size, RuntimeError, where(chunk), " is damaged: item ", local,
             " lies outside the file. Copy the dataset folder again, or write the dataset again");
    if (whole) return {data + begin, end - begin, whole};
    if (compression == Compression::PerItem) {  // each item its own zstd frame
      std::shared_ptr<const std::string> bytes;
      try {
        bytes = std::make_shared<const std::string>(zstd_inflate(open->data + begin, end - begin, 0));
      } catch (const std::runtime_error& e) {
        damaged(chunk, "item " + std::to_string(local) + ": " + e.what());
      }
      return {reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(), bytes};
    }
    return {open->data + begin, end - begin, open};
  }
};

}  // namespace data_detail

namespace data_detail {
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
std::filesystem::path remote_cache_dir(const storage::S3Client& client, const storage::S3Url& url,
                                       const std::string& cache_dir) {
  std::filesystem::path root;
  if (!cache_dir.empty()) {
    root = cache_dir;
  } else if (const char* set = std::getenv("LT_STREAMING_CACHE_DIR"); set && *set) {
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

StreamingDataset::StreamingDataset(const std::filesystem::path& dir, StreamingDatasetOptions options)
    : files_(std::make_unique<data_detail::DatasetFiles>()) {
  using nlohmann::json;
  auto& files = *files_;
  files.origin = files.dir = dir;
  const std::string who = "StreamingDataset(" + dir.string() + ")";
  storage::S3Url::refuse_other_schemes(dir.string(), who);
  std::map<std::string, int64_t> remote_sizes;  // an s3:// dataset's objects under its prefix
  if (storage::S3Url::is_s3(dir.string())) {
    LF_CHECK(options.max_cache_bytes_ >= 1, ValueError, who, ": max_cache_bytes must be positive, got ",
             options.max_cache_bytes_, " (LitData's max_cache_size; the default is 100 GB)");
    const auto remote = storage::S3Url::parse(dir.string(), who);
    auto client = storage::S3Client::from_environment(who);
    files.dir = remote_cache_dir(client, remote, options.cache_dir_);
    std::error_code made;
    std::filesystem::create_directories(files.dir, made);
    LF_CHECK(!made, ValueError, who, ": cannot make the cache folder ", files.dir.string(), " (", made.message(),
             "); set cache_dir (or LT_STREAMING_CACHE_DIR) to a writable folder");
    try {
      remote_sizes = client.list_folder(remote);
    } catch (const RuntimeError& e) {
      throw RuntimeError(who + ": " + e.what());
    }
    LF_CHECK(remote_sizes.count("index.json") > 0, ValueError, who, ": there is no index.json under ", dir.string(),
             " (", remote_sizes.size(), " objects there); it is not a dataset written by litdata.optimize or "
             "lf::StreamingWriter, or its writer did not finish");
    client.get_to_file(remote.child("index.json"), files.dir / "index.json");  // always the current one
    files.cache.emplace(files.dir, std::move(client), remote, options.max_cache_bytes_, who);
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
      LF_CHECK(files.cache ? listed != remote_sizes.end() : std::filesystem::exists(path), ValueError, who, ": chunk ",
               chunk->filename, " listed in index.json is missing. Copy the whole dataset folder again, or write the "
               "dataset again");
      const auto size = files.cache ? listed->second : static_cast<int64_t>(std::filesystem::file_size(path));
      LF_CHECK(size >= chunk->bytes || files.compression == data_detail::Compression::WholeFile, ValueError, who, ": chunk ", chunk->filename, " has ", size,
               " bytes, index.json says ", chunk->bytes,
               " (truncated, or the index does not match the chunks). Copy the dataset folder again, or write it again");
      chunk->remote_bytes = size;
      LF_CHECK(!files.cache || size <= options.max_cache_bytes_, ValueError, who, ": max_cache_bytes ",
               options.max_cache_bytes_, " cannot hold chunk ", chunk->filename, " (", size, " bytes); the cache holds "
               "the chunks being read and those fetched ahead: raise max_cache_bytes to a few chunks at least");
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
int64_t StreamingDataset::cache_peak_bytes() const { return files_->cache ? files_->cache->peak_bytes() : 0; }
int64_t StreamingDataset::chunks_downloaded() const { return files_->cache ? files_->cache->downloads() : 0; }
bool StreamingDataset::fetch_ahead(size_t chunk) const {
  if (!files_->cache) return true;
  const auto& each = *files_->chunks[chunk];
  return files_->cache->fetch_ahead(each.filename, each.remote_bytes);
}
int64_t StreamingDataset::cache_budget() const { return files_->cache ? files_->cache->budget() : 0; }
int64_t StreamingDataset::chunk_object_bytes(size_t chunk) const { return files_->chunks[chunk]->remote_bytes; }
void StreamingDataset::release_chunk(size_t chunk) const {
  if (!files_->cache) return;
  std::lock_guard<std::mutex> opening(files_->chunks[chunk]->opening);  // as open(): opening, then cache_mutex
  std::lock_guard<std::mutex> lock(files_->cache_mutex);
  auto& recent = files_->recent;
  const data_detail::OpenChunk* open = files_->chunks[chunk]->open.lock().get();
  recent.erase(std::remove_if(recent.begin(), recent.end(), [&](const auto& each) { return each.get() == open; }),
               recent.end());
}

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
