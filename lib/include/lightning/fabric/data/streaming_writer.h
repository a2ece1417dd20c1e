// StreamingWriter: writes items into LitData's optimised layout (chunk files and index.json), so
// that lf::StreamingDataset and Python's litdata.StreamingDataset read them back item for item:
//
//   lf::StreamingWriter writer("/data/train", lf::StreamingWriterOptions().chunk_bytes(64 << 20));
//   for (...) writer.add(c10::ivalue::Tuple::create({image_tensor, int64_t{label}}));
//   writer.finish();                              // writes index.json; the dataset exists from here
//
// Items are c10::IValue trees (tuples, lists, dicts with string keys) whose leaves are ints,
// doubles, bools, strings, None and tensors; every item has the first item's structure. Each leaf
// gets LitData's format for its type (int, float, bool, str, pickle for None, no_header_tensor:CODE
// for a 1-D tensor, tensor otherwise) unless `formats` names one per leaf (bytes for a string of
// raw bytes, numpy / no_header_numpy:CODE for a tensor Python should read as a NumPy array, jpeg
// for a uint8 image tensor to encode, or a string of JPEG bytes).
// compression("zstd") compresses chunks as litdata.optimize(compression="zstd") does.
// Files appear whole or not at all: each chunk is written to a temporary name and renamed, and
// index.json last; a writer destroyed before finish() removes its chunks. An s3://bucket/prefix
// destination uploads each chunk as it is written and index.json last (docs/data.md, "Object
// storage").
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lightning::fabric {

struct LF_API StreamingWriterOptions {
  /// Items per chunk; or (chunk_bytes) the largest number of items whose payloads fit this many
  /// bytes (an item larger than that gets a chunk of its own). Exactly one of the two is set.
  std::optional<int64_t> chunk_size_;
  std::optional<int64_t> chunk_bytes_;
  /// One LitData format name per leaf, in flattening order; empty: each leaf's default.
  std::vector<std::string> formats_;
  /// LitData's compression: "zstd" (level 4) or "zstd:LEVEL" (1 to 22), each chunk's items
  /// compressed in frames of 256 (litdata's default compression_level "batch"). Default: none.
  std::optional<std::string> compression_;
  /// Several writers filling one folder: each writes chunk-RANK-K.bin and RANK.index.json, and
  /// StreamingWriter::merge_index(dir) (or any reader) joins them. Default: one writer, index.json.
  std::optional<int> writer_rank_;

  StreamingWriterOptions& chunk_size(int64_t items) { chunk_size_ = items; return *this; }
  StreamingWriterOptions& chunk_bytes(int64_t bytes) { chunk_bytes_ = bytes; return *this; }
  StreamingWriterOptions& formats(std::vector<std::string> names) { formats_ = std::move(names); return *this; }
  StreamingWriterOptions& writer_rank(int rank) { writer_rank_ = rank; return *this; }
  StreamingWriterOptions& compression(std::string name) { compression_ = std::move(name); return *this; }
};

namespace data_detail {
struct WriterState;
}

class LF_API StreamingWriter {
 public:
  /// Creates `dir` if needed. ValueError when it already holds an index or chunks (a dataset is
  /// written once; delete it first), or for options out of range.
  StreamingWriter(const std::filesystem::path& dir, StreamingWriterOptions options);
  ~StreamingWriter();
  StreamingWriter(const StreamingWriter&) = delete;
  StreamingWriter& operator=(const StreamingWriter&) = delete;

  /// Appends one item. ValueError naming the item and the leaf for a structure or a type that
  /// differs from the first item's, or a leaf its format cannot store.
  void add(const c10::IValue& item);
  /// Writes the last chunk and the index. Further add() calls are errors.
  void finish();
  /// Items added so far.
  int64_t size() const;

  /// Joins the RANK.index.json files that writers with writer_rank left in `dir` into index.json
  /// (chunks in rank order) and removes them, as litdata.optimize's merge does.
  static void merge_index(const std::filesystem::path& dir);

 private:
  std::unique_ptr<data_detail::WriterState> state_;
};

}  // namespace lightning::fabric
