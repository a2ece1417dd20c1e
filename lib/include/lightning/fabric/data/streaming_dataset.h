// StreamingDataset: a dataset in LitData's optimised layout (a folder of chunk files and an
// index.json, written by Python's litdata.optimize or by lf::StreamingWriter), read item by item
// without loading it whole. Items come back as c10::IValue trees shaped as they were written:
//
//   lf::StreamingDataset dataset("/data/train");           // reads index.json
//   c10::IValue item = dataset.get(0);                      // e.g. a tuple (image tensor, label int)
//   auto image = item.toTupleRef().elements()[0].toTensor();
//
// Leaves by LitData format (docs/data.md has the table): int -> int, float -> double, bool ->
// bool, str/text -> string, bytes/file -> string of raw bytes, tensor/numpy (with or without
// header) -> tensor of the written dtype and shape, jpeg/image -> uint8 tensor [3, H, W] RGB,
// pil -> uint8 tensor [H, W, C] (or [H, W] for one band), json -> lists/dicts/scalars, a pickled
// None -> None. Tuples, lists and dicts (keys in written order) nest as written. Chunks may be
// zstd-compressed at any of LitData's granularities (frames of items, each item, the whole file).
// get() is thread-safe; chunk files are memory-mapped when first read and stay mapped.
//
// On object storage (docs/data.md, "Object storage"), `dir` is an s3:// URL: index.json is read
// from the bucket, and chunks are downloaded into a local cache the node's processes share,
// bounded by max_cache_bytes (LitData's max_cache_size): a chunk is fetched once while the budget
// keeps it, held while read, and evicted once read when room is needed. A StreamingDataLoader
// fetches its next chunks ahead of its reading threads.
//
//   lf::StreamingDataset remote("s3://bucket/train", lf::StreamingDatasetOptions().max_cache_bytes(int64_t{20} << 30));
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lightning::fabric {

namespace data_detail {
struct DatasetFiles;
}

/// Where an s3:// dataset's chunks are cached; each setter returns the options for chaining.
struct LF_API StreamingDatasetOptions {
  /// The cache's root folder (a folder per dataset is made inside); empty: LT_STREAMING_CACHE_DIR,
  /// else $XDG_CACHE_HOME (or ~/.cache)/lightning-fabric/streaming. Processes of a node that
  /// read the same dataset share its folder.
  StreamingDatasetOptions& cache_dir(std::string value) {
    cache_dir_ = std::move(value);
    return *this;
  }
  /// Bytes of chunks on the node's disk at most, downloads in progress included (LitData's
  /// max_cache_size, 100 GB by default).
  StreamingDatasetOptions& max_cache_bytes(int64_t value) {
    max_cache_bytes_ = value;
    return *this;
  }
  std::string cache_dir_;
  int64_t max_cache_bytes_ = int64_t{100} * 1000 * 1000 * 1000;
};

class StreamingDataLoader;

class LF_API StreamingDataset {
 public:
  /// Opens `dir` (its index.json, or the {rank}.index.json files a multi-writer job left, merged
  /// in rank order), a folder or an s3:// URL (`options` apply to s3:// only). ValueError naming
  /// the file and the fix for a missing or damaged index, and for a budget smaller than a chunk.
  explicit StreamingDataset(const std::filesystem::path& dir, StreamingDatasetOptions options = {});
  ~StreamingDataset();
  StreamingDataset(const StreamingDataset&) = delete;
  StreamingDataset& operator=(const StreamingDataset&) = delete;

  /// Items in the dataset, over all chunks.
  int64_t size() const;
  /// The item with this global index (chunks in index order, items in chunk order).
  /// ValueError out of range; RuntimeError naming the chunk file for a damaged chunk.
  c10::IValue get(int64_t index) const;
  /// The raw payload of an item: what get() decodes (for measuring and copying).
  std::string raw(int64_t index) const;

  /// Items per chunk, in index order (what the reading order is planned from).
  const std::vector<int64_t>& chunk_sizes() const;
  /// The LitData format name of every leaf, in flattening order (index.json's data_format).
  const std::vector<std::string>& data_format() const;
  const std::filesystem::path& dir() const;
  /// An s3:// dataset's cache: the most bytes on the node's disk this process saw (at most
  /// max_cache_bytes), and the chunks this process downloaded. 0 for a local folder.
  int64_t cache_peak_bytes() const;
  int64_t chunks_downloaded() const;

 private:
  friend class StreamingDataLoader;
  /// Downloads chunk `chunk` of an s3:// dataset into the cache ahead of its reader (the loader's
  /// fetch ahead); false when the cache has no room now. True at once for a local folder.
  bool fetch_ahead(size_t chunk) const;
  /// An s3:// dataset's cache budget (0 for a local folder) and chunk `chunk`'s object size.
  int64_t cache_budget() const;
  int64_t chunk_object_bytes(size_t chunk) const;
  /// Lets go of chunk `chunk` once the loader's pass has read it (an s3:// chunk kept open
  /// between items is then evictable); nothing for a local folder.
  void release_chunk(size_t chunk) const;

  std::unique_ptr<data_detail::DatasetFiles> files_;
};

}  // namespace lightning::fabric
