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
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace lightning::fabric {

namespace data_detail {
struct DatasetFiles;
}

class LF_API StreamingDataset {
 public:
  /// Opens `dir` (its index.json, or the {rank}.index.json files a multi-writer job left, merged
  /// in rank order). ValueError naming the file and the fix for a missing or damaged index.
  explicit StreamingDataset(const std::filesystem::path& dir);
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

 private:
  std::unique_ptr<data_detail::DatasetFiles> files_;
};

}  // namespace lightning::fabric
