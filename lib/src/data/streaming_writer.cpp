#include "lightning/fabric/data/streaming_writer.h"

#include "lightning/fabric/checkpoint/atomic_file.h"
#include "lightning/fabric/data/litdata_format.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/storage/s3_client.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <regex>

namespace lightning::fabric {

namespace data_detail {

struct WriterState {
  std::filesystem::path origin;  // as given: a folder, or an s3:// URL
  std::filesystem::path dir;     // where files are written: origin, or a local staging folder for s3://
  // s3://: each finished file is uploaded from dir and removed there (index.json last).
  std::optional<storage::S3Url> remote;
  std::optional<storage::S3Client> client;
  std::vector<storage::S3Url> uploaded;
  StreamingWriterOptions options;
  int rank = 0;
  bool finished = false;
  int64_t items = 0;
  TreeSpec spec;
  std::vector<std::string> formats;
  std::vector<std::string> pending;  // payloads of the chunk being filled
  int64_t pending_bytes = 0;
  nlohmann::json chunks = nlohmann::json::array();
  std::vector<std::filesystem::path> written;
  int zstd_level = 0;  // 0: no compression
  static constexpr uint32_t kFrameRows = 256;  // items per zstd frame, litdata's compression_batch_size

  std::string who() const { return "StreamingWriter(" + origin.string() + ")"; }

  // s3://: uploads the finished file `name` of dir and removes the local copy.
  void publish(const std::string& name) {
    if (!remote) return;
    const std::filesystem::path local = dir / name;
    std::ifstream in(local, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    try {
      client->put(remote->child(name), bytes);
    } catch (const RuntimeError& e) {
      throw RuntimeError(who() + ": " + e.what());
    }
    uploaded.push_back(remote->child(name));
    std::filesystem::remove(local);
  }

  void flush() {
    if (pending.empty()) return;
    const uint32_t n = static_cast<uint32_t>(pending.size());
    std::string header(4 * (size_t{n} + 2), '\0');
    uint32_t offset = 4 * (n + 2);
    std::memcpy(&header[0], &n, 4);
    for (uint32_t i = 0; i <= n; ++i) {
      std::memcpy(&header[4 + 4 * size_t{i}], &offset, 4);
      if (i < n) {
        LF_CHECK(offset + pending[i].size() < (uint64_t{1} << 32), ValueError, who(),
                 ": a chunk would pass 4 GiB, the most LitData's offsets address; set a smaller chunk_bytes or chunk_size");
        offset += static_cast<uint32_t>(pending[i].size());
      }
    }
    const std::string name = "chunk-" + std::to_string(rank) + "-" + std::to_string(chunks.size()) + ".bin";
    uint64_t file_bytes = offset;
    if (zstd_level > 0) {
      const std::string framed = frame(n);
      write_file_atomically(dir / name, framed);
      file_bytes = framed.size();
    } else {
      write_file_atomically(dir / name, [&](const ByteSink& sink) {
        sink(header.data(), header.size());
        for (const auto& payload : pending) sink(payload.data(), payload.size());
      });
    }
    written.push_back(dir / name);
    publish(name);
    chunks.push_back({{"chunk_bytes", file_bytes}, {"chunk_size", n}, {"dim", nullptr}, {"filename", name}});
    pending.clear();
    pending_bytes = 0;
  }

  // The pending items as a framed chunk (LDFZ01, litdata's compression_level "batch"): a header,
  // the items' offsets into their uncompressed concatenation, a frame table, then one zstd frame
  // per kFrameRows items.
  std::string frame(uint32_t n) const {
    const uint32_t frames = (n + kFrameRows - 1) / kFrameRows;
    std::string offsets(4 * (size_t{n} + 1), '\0');
    uint32_t logical = 0;
    for (uint32_t i = 0; i <= n; ++i) {
      std::memcpy(&offsets[4 * size_t{i}], &logical, 4);
      if (i < n) logical += static_cast<uint32_t>(pending[i].size());
    }
    std::vector<std::string> compressed;
    std::string table(24 * size_t{frames}, '\0');
    uint64_t cursor = 24 + offsets.size() + table.size();
    for (uint32_t f = 0; f < frames; ++f) {
      const uint32_t first = f * kFrameRows, count = std::min(kFrameRows, n - first);
      std::string raw;
      for (uint32_t i = first; i < first + count; ++i) raw += pending[i];
      compressed.push_back(zstd_deflate(reinterpret_cast<const uint8_t*>(raw.data()), raw.size(), zstd_level));
      const uint32_t compressed_size = static_cast<uint32_t>(compressed.back().size()), raw_size = static_cast<uint32_t>(raw.size());
      char* entry = &table[24 * size_t{f}];
      std::memcpy(entry, &first, 4);
      std::memcpy(entry + 4, &count, 4);
      std::memcpy(entry + 8, &cursor, 8);
      std::memcpy(entry + 16, &compressed_size, 4);
      std::memcpy(entry + 20, &raw_size, 4);
      cursor += compressed_size;
    }
    std::string out("LDFZ01\0\0", 8);
    const uint16_t version = 1, flags = 0;
    out.append(reinterpret_cast<const char*>(&version), 2);
    out.append(reinterpret_cast<const char*>(&flags), 2);
    out.append(reinterpret_cast<const char*>(&n), 4);
    out.append(reinterpret_cast<const char*>(&kFrameRows), 4);
    out.append(reinterpret_cast<const char*>(&frames), 4);
    out += offsets;
    out += table;
    for (const auto& part : compressed) out += part;
    return out;
  }

  nlohmann::json index() const {
    nlohmann::json config = {
        {"chunk_bytes", options.chunk_bytes_ ? nlohmann::json(*options.chunk_bytes_) : nlohmann::json(nullptr)},
        {"chunk_size", options.chunk_size_ ? nlohmann::json(*options.chunk_size_) : nlohmann::json(nullptr)},
        {"compression", options.compression_ ? nlohmann::json(*options.compression_) : nlohmann::json(nullptr)},
        {"compression_batch_size", zstd_level > 0 ? nlohmann::json(kFrameRows) : nlohmann::json(nullptr)},
        {"compression_level", zstd_level > 0 ? nlohmann::json("batch") : nlohmann::json(nullptr)},
        {"data_format", formats},
        {"data_spec", tree_spec_json(spec)},
        {"encryption", nullptr},
        {"ipc_compression", nullptr},
        {"item_loader", "PyTreeLoader"},
        {"types", nullptr}};
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    char stamp[64];
    std::snprintf(stamp, sizeof(stamp), "%.6f", now);
    return {{"chunks", chunks}, {"config", config}, {"updated_at", stamp}};
  }
};

namespace {
// Python's json.dump(sort_keys=True) layout: ", " and ": " separators, ASCII only.
std::string python_json(const nlohmann::json& value) {
  std::string out;
  switch (value.type()) {
    case nlohmann::json::value_t::object: {
      out = "{";
      bool first = true;
      for (auto it = value.begin(); it != value.end(); ++it) {  // nlohmann keeps keys sorted
        out += (first ? "" : ", ") + nlohmann::json(it.key()).dump(-1, ' ', true) + ": " + python_json(it.value());
        first = false;
      }
      return out + "}";
    }
    case nlohmann::json::value_t::array: {
      out = "[";
      for (size_t i = 0; i < value.size(); ++i) out += (i ? ", " : "") + python_json(value[i]);
      return out + "]";
    }
    default: return value.dump(-1, ' ', true);
  }
}
}  // namespace

std::pair<nlohmann::json, std::vector<std::filesystem::path>> merge_writer_indexes(const std::filesystem::path& dir,
                                                                                  const std::string& who) {
  std::vector<std::pair<int64_t, std::filesystem::path>> parts;
  static const std::regex part_name(R"(([0-9]+)\.index\.json)");
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, part_name)) parts.emplace_back(std::stoll(match[1]), entry.path());
  }
  std::sort(parts.begin(), parts.end());
  nlohmann::json merged;
  std::vector<std::filesystem::path> paths;
  for (const auto& [rank, path] : parts) {
    nlohmann::json part;
    try {
      std::ifstream in(path);
      part = nlohmann::json::parse(in);
      part.at("chunks");
      part.at("config").at("data_format");
    } catch (const nlohmann::json::exception& e) {
      throw ValueError(who + ": " + path.string() + " is damaged (" + e.what() + "); write the dataset again");
    }
    paths.push_back(path);
    if (merged.is_null()) {
      merged = std::move(part);
      continue;
    }
    LF_CHECK(part.at("config").at("data_format") == merged.at("config").at("data_format") &&
                 part.at("config").value("data_spec", nlohmann::json()) == merged.at("config").value("data_spec", nlohmann::json()),
             ValueError, who, ": ", path.filename().string(), " was written with other item formats than ",
             paths.front().filename().string(), "; the writers of one dataset write one kind of item");
    for (auto& chunk : part.at("chunks")) merged["chunks"].push_back(chunk);
  }
  return {merged, paths};
}

}  // namespace data_detail

StreamingWriter::StreamingWriter(const std::filesystem::path& dir, StreamingWriterOptions options)
    : state_(std::make_unique<data_detail::WriterState>()) {
  auto& state = *state_;
  state.origin = state.dir = dir;
  state.options = std::move(options);
  state.rank = state.options.writer_rank_.value_or(0);
  const std::string who = state.who();
  LF_CHECK(state.options.chunk_size_.has_value() != state.options.chunk_bytes_.has_value(), ValueError, who,
           ": set exactly one of chunk_size (items per chunk) and chunk_bytes (bytes per chunk), as litdata.optimize asks");
  LF_CHECK(state.options.chunk_size_.value_or(1) > 0 && state.options.chunk_bytes_.value_or(1) > 0, ValueError, who,
           ": chunk_size and chunk_bytes must be positive");
  LF_CHECK(state.rank >= 0, ValueError, who, ": writer_rank must be 0 or more, got ", state.rank);
  if (state.options.compression_) {
    const std::string& name = *state.options.compression_;
    int level = 0;
    if (name == "zstd") {
      level = 4;  // litdata's default level
    } else if (name.rfind("zstd:", 0) == 0) {
      try {
        level = std::stoi(name.substr(5));
      } catch (const std::exception&) {
      }
    }
    LF_CHECK(level >= 1 && level <= 22, ValueError, who, ": compression \"", name,
             "\" is not one LitData offers; use \"zstd\" or \"zstd:LEVEL\" with LEVEL 1 to 22");
    LF_CHECK(data_detail::zstd_available(), ValueError, who,
             ": compression needs zstd, which this build of lightning_fabric lacks (Debian: libzstd-dev when building)");
    state.zstd_level = level;
  }
  const std::regex ours(state.options.writer_rank_ ? "chunk-" + std::to_string(state.rank) + "-[0-9]+\\.bin|" +
                                                        std::to_string(state.rank) + "\\.index\\.json|index\\.json"
                                                  : std::string("chunk-.*\\.bin|([0-9]+\\.)?index\\.json"));
  storage::S3Url::refuse_other_schemes(dir.string(), who);
  if (storage::S3Url::is_s3(dir.string())) {
    state.remote = storage::S3Url::parse(dir.string(), who);
    state.client = storage::S3Client::from_environment(who);
    std::map<std::string, int64_t> present;
    try {
      present = state.client->list_folder(*state.remote);
    } catch (const RuntimeError& e) {
      throw RuntimeError(who + ": " + e.what());
    }
    for (const auto& [name, size] : present) {
      (void)size;
      LF_CHECK(name.find('/') != std::string::npos || !std::regex_match(name, ours), ValueError, who, ": ", dir.string(),
               " already holds a dataset (", name, "); a dataset is written once: remove its objects, or write to another prefix");
    }
    static std::atomic<int> staging_count{0};
    state.dir = std::filesystem::temp_directory_path() /
                ("lf-writer-" + std::to_string(::getpid()) + "-" + std::to_string(staging_count++));
    std::filesystem::remove_all(state.dir);
  }
  std::filesystem::create_directories(state.dir);
  if (state.remote) return;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    LF_CHECK(!std::regex_match(entry.path().filename().string(), ours), ValueError, who, ": ", dir.string(),
             " already holds a dataset (", entry.path().filename().string(),
             "); a dataset is written once: remove the folder, or write to another one");
  }
}

StreamingWriter::~StreamingWriter() {
  if (!state_) return;
  std::error_code ignored;
  if (state_->remote) std::filesystem::remove_all(state_->dir, ignored);  // the staging folder
  if (state_->finished) return;
  // An unfinished dataset leaves nothing that looks readable.
  for (const auto& path : state_->written) std::filesystem::remove(path, ignored);
  for (const auto& object : state_->uploaded) {
    try {
      state_->client->remove(object);
    } catch (const std::exception&) {  // best effort: without index.json no reader takes the chunks for a dataset
    }
  }
}

int64_t StreamingWriter::size() const { return state_->items; }

void StreamingWriter::add(const c10::IValue& item) {
  auto& state = *state_;
  const std::string who = state.who() + ".add (item " + std::to_string(state.items) + ")";
  LF_CHECK(!state.finished, ValueError, who, ": the writer is finished; make a new writer for another dataset");
  std::vector<c10::IValue> leaves;
  data_detail::TreeSpec spec;
  try {
    spec = data_detail::tree_spec_of(item);
    if (state.items > 0) {
      LF_CHECK(spec == state.spec, ValueError, who, ": its structure is ", data_detail::tree_spec_json(spec),
               ", the first item's was ", data_detail::tree_spec_json(state.spec),
               "; every item of a dataset has one structure (same containers, same dict keys in the same order)");
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw ValueError(who + ": " + e.what());
  }
  data_detail::flatten(item, leaves);
  // The first item decides the formats; they are kept only once it encoded whole.
  std::vector<std::string> formats = state.formats;
  if (state.items == 0) {
    if (state.options.formats_.empty()) {
      for (size_t i = 0; i < leaves.size(); ++i) {
        try {
          formats.push_back(data_detail::default_format(leaves[i]));
        } catch (const std::exception& e) {
          throw ValueError(who + ", leaf " + std::to_string(i) + ": " + e.what());
        }
      }
    } else {
      LF_CHECK(state.options.formats_.size() == leaves.size(), ValueError, who, ": formats names ",
               state.options.formats_.size(), " leaves, the item has ", leaves.size());
      formats = state.options.formats_;
    }
  }
  std::string payload(4 * leaves.size(), '\0');
  for (size_t i = 0; i < leaves.size(); ++i) {
    std::string bytes;
    try {
      bytes = data_detail::encode_leaf(formats[i], leaves[i]);
    } catch (const std::exception& e) {
      throw ValueError(who + ", leaf " + std::to_string(i) + ": " + e.what());
    }
    const uint32_t length = static_cast<uint32_t>(bytes.size());
    std::memcpy(&payload[4 * i], &length, 4);
    payload += bytes;
  }
  if (state.items == 0) {
    state.spec = std::move(spec);
    state.formats = std::move(formats);
  }
  const int64_t size = static_cast<int64_t>(payload.size());
  if (state.options.chunk_bytes_ && !state.pending.empty() && state.pending_bytes + size > *state.options.chunk_bytes_)
    state.flush();
  state.pending.push_back(std::move(payload));
  state.pending_bytes += size;
  ++state.items;
  if (state.options.chunk_size_ && static_cast<int64_t>(state.pending.size()) >= *state.options.chunk_size_) state.flush();
}

void StreamingWriter::finish() {
  auto& state = *state_;
  LF_CHECK(!state.finished, ValueError, state.who(), ".finish: already finished");
  LF_CHECK(state.items > 0, ValueError, state.who(), ".finish: no item was added; a dataset needs at least one");
  state.flush();
  const auto name = state.options.writer_rank_ ? std::to_string(state.rank) + ".index.json" : std::string("index.json");
  write_file_atomically(state.dir / name, data_detail::python_json(state.index()));
  state.publish(name);  // s3://: the index last, so the dataset exists once it is whole
  state.finished = true;
}

void StreamingWriter::merge_index(const std::filesystem::path& dir) {
  const std::string who = "StreamingWriter::merge_index(" + dir.string() + ")";
  LF_CHECK(!storage::S3Url::is_s3(dir.string()), ValueError, who, ": merging the writers' indexes reads a local folder; "
           "for s3:// write with one writer, or write the folder locally, merge it and upload it");
  const auto [merged, parts] = data_detail::merge_writer_indexes(dir, who);
  LF_CHECK(!parts.empty(), ValueError, who, ": no RANK.index.json to merge (writers with writer_rank leave one each)");
  write_file_atomically(dir / "index.json", data_detail::python_json(merged));
  for (const auto& part : parts) std::filesystem::remove(part);
}

}  // namespace lightning::fabric
