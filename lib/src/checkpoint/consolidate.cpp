#include "lightning/fabric/checkpoint/consolidate.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <sstream>

#include "lightning/fabric/checkpoint/atomic_file.h"
#include "lightning/fabric/checkpoint/dcp_format.h"
#include "lightning/fabric/checkpoint/pickle_tree.h"
#include "lightning/fabric/checkpoint/sharded_format.h"
#include "lightning/fabric/checkpoint/zip_archive.h"
#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace fs = std::filesystem;
using pickle::Node;
using pickle::NodePtr;

namespace {
// One torch.save file of the folder: mapped, checksums verified, pickle parsed.
struct Archive {
  // Checks the pickle's checksum; the tensor records are checked by verify_records (in parallel
  // with the copy).
  Archive(const fs::path& path, const std::string& what) : Archive(std::make_shared<zip::MappedFile>(path), 0, 0, what) {}
  // The archive at [offset, offset + length) of a shared mapped file (length 0: to the end).
  Archive(std::shared_ptr<zip::MappedFile> mapped, uint64_t offset, uint64_t length, const std::string& what)
      : owner(std::move(mapped)), file(*owner), base(offset),
        reader(length ? owner->bytes().substr(offset, length) : owner->bytes(), what), what(what) {
    const zip::Entry* pickle_entry = reader.find_suffix("/data.pkl");
    LF_CHECK(pickle_entry != nullptr, RuntimeError, what, " is not a torch.save archive: it has no data.pkl.");
    reader.verify(*pickle_entry);
    prefix = pickle_entry->name.substr(0, pickle_entry->name.size() - std::string("data.pkl").size());
    root = pickle::parse(reader.content(*pickle_entry), what);
  }
  const zip::Entry& record(const std::string& key) const {
    const zip::Entry* entry = reader.find(prefix + "data/" + key);
    LF_CHECK(entry != nullptr, RuntimeError, what, " is incomplete: its tensor record ", key, " is missing.");
    return *entry;
  }
  // A record's bytes as a range of the underlying file.
  zip::FileRange range(const zip::Entry& entry, uint64_t skip, uint64_t size) const {
    return {file.fd(), base + entry.data_offset + skip, size};
  }
  std::shared_ptr<zip::MappedFile> owner;
  const zip::MappedFile& file;
  uint64_t base = 0;
  zip::Reader reader;
  std::string what, prefix;
  NodePtr root;
};

struct Record {
  std::vector<zip::FileRange> pieces;
  uint32_t crc32 = 0;
  std::string content;  // assembled in memory when the pieces are empty
};

// The output archive: its records, and the one write that verifies every input's checksums on the
// second core while the kernel copies their bytes; the output only takes its name once both are done.
class OutputArchive {
 public:
  std::string add_record(Record record) {
    records_.push_back(std::move(record));
    return std::to_string(records_.size() - 1);
  }

  // Points every tensor under node at a record of this output holding the archive's bytes.
  void adopt_tensors(const NodePtr& node, const Archive& archive) {
    if (!node || !visited_.insert(node.get()).second) return;
    if (auto tensor = pickle::as_tensor(*node)) {
      const std::string source = archive.what + "\n" + tensor->key;
      auto found = adopted_.find(source);
      if (found == adopted_.end()) {
        const zip::Entry& entry = archive.record(tensor->key);
        found = adopted_.emplace(source, add_record({{archive.range(entry, 0, entry.size)}, entry.crc32, {}})).first;
      }
      pickle::set_tensor_key(*node, found->second);
      return;
    }
    for (const auto& item : node->items) adopt_tensors(item, archive);
  }

  uint64_t write(const fs::path& output, const Node& root, const std::vector<const Archive*>& inputs,
                 const std::string& version, bool force_zip64) {
    uint64_t bytes = 0;
    write_file_atomically_fd(output, [&](int fd) {
      std::exception_ptr corrupted;
      std::thread verifier([&] {
        try {
          for (const Archive* input : inputs) input->reader.verify_all();
        } catch (...) {
          corrupted = std::current_exception();
        }
      });
      try {
        zip::Writer writer(fd, output.string(), force_zip64);
        writer.add("archive/data.pkl", pickle::write(root));
        for (size_t key = 0; key < records_.size(); ++key) {
          const Record& record = records_[key];
          if (record.pieces.empty()) {
            writer.add("archive/data/" + std::to_string(key), record.content);
          } else {
            writer.add("archive/data/" + std::to_string(key), record.pieces, record.crc32);
          }
        }
        writer.add("archive/version", version);
        writer.finish();
        bytes = writer.bytes_written();
      } catch (...) {
        verifier.join();
        throw;
      }
      verifier.join();
      if (corrupted) std::rethrow_exception(corrupted);
    });
    return bytes;
  }

 private:
  std::vector<Record> records_;
  std::map<std::string, std::string> adopted_;
  std::set<const Node*> visited_;
};

bool has_int_keys(const Node& dict) {
  for (size_t i = 0; i < dict.items.size(); i += 2) {
    if (dict.items[i]->kind == Node::Kind::Int) return true;
  }
  return false;
}

// Puts value at a "/"-separated path of nested dicts, creating the missing ones (integer keys
// where the parent's keys are integers, like an optimizer's "state").
void insert_at_path(const NodePtr& root, const std::string& path, NodePtr value) {
  Node* dict = pickle::as_dict(root);
  LF_CHECK(dict != nullptr, RuntimeError, "common.pt does not hold a dictionary, so ", path, " has no place in it.");
  const auto elements = split_checkpoint_path(path);
  for (size_t i = 0; i < elements.size(); ++i) {
    LF_CHECK(dict != nullptr, RuntimeError, "Cannot place ", path, ": '", elements[i - 1], "' is not a dictionary.");
    NodePtr* slot = pickle::dict_find(*dict, elements[i]);
    if (slot == nullptr) {
      const bool numeric = !elements[i].empty() && elements[i].find_first_not_of("0123456789") == std::string::npos;
      dict->items.push_back(numeric && has_int_keys(*dict) ? pickle::make_int(std::stoll(elements[i]))
                                                            : pickle::make_string(elements[i]));
      // A plain dict: a type tag is a torch.jit global that torch.load(weights_only=True) refuses.
      dict->items.push_back(i + 1 == elements.size() ? value : pickle::make_node(Node::Kind::Dict));
      slot = &dict->items.back();
    } else if (i + 1 == elements.size()) {
      *slot = value;
    }
    dict = pickle::as_dict(*slot);
  }
}

class Splicer {
 public:
  explicit Splicer(const fs::path& folder) : folder_(folder), layout_(read_sharded_layout(folder)) {
    const fs::path common = folder / "common.pt";
    LF_CHECK(fs::is_regular_file(common), RuntimeError, "Sharded checkpoint ", folder.string(),
             " is incomplete: common.pt is missing.");
    common_ = std::make_unique<Archive>(common, "Checkpoint " + common.string());
    for (int part = 0; part < layout_.parts; ++part) {
      const fs::path file = folder / shard_file_name(part, layout_.parts);
      LF_CHECK(fs::is_regular_file(file), RuntimeError, "Sharded checkpoint ", folder.string(), " is incomplete: ",
               file.filename().string(), " is missing (it was saved by ", layout_.parts, " shard writers).");
      shards_.push_back(std::make_unique<Archive>(file, "Checkpoint " + file.string()));
    }
  }

  ConsolidateSummary write(const fs::path& output, bool force_zip64) {
    output_.adopt_tensors(common_->root, *common_);  // buffers, small values: their bytes as they are
    for (const auto& [path, tensor] : layout_.tensors) insert_at_path(common_->root, path, assemble(path, tensor));
    ConsolidateSummary summary;
    summary.tensors = static_cast<int64_t>(layout_.tensors.size());
    const zip::Entry* version = common_->reader.find(common_->prefix + "version");
    std::vector<const Archive*> inputs = {common_.get()};
    for (const auto& shard : shards_) inputs.push_back(shard.get());
    summary.bytes = output_.write(output, *common_->root, inputs,
                                  version ? std::string(common_->reader.content(*version)) : "3\n", force_zip64);
    return summary;
  }

 private:
  // One whole tensor from every part's slice, in part order.
  NodePtr assemble(const std::string& path, const ShardedTensorLayout& layout) {
    const std::string storage_type = pickle::storage_type_of(layout.dtype);
    const int element_size = pickle::element_size(storage_type);
    LF_CHECK(element_size > 0, RuntimeError, "metadata.json of ", folder_.string(), ": unknown dtype \"", layout.dtype,
             "\" for ", path, ".");
    Record record;
    for (int part = 0; part < layout_.parts; ++part) {
      const ShardSlice slice = shard_slice(layout.numel(), layout_.parts, part);
      const Archive& shard = *shards_[static_cast<size_t>(part)];
      Node* dict = pickle::as_dict(shard.root);
      NodePtr* value = dict ? pickle::dict_find(*dict, path) : nullptr;
      const auto tensor = value ? pickle::as_tensor(**value) : std::nullopt;
      LF_CHECK(tensor.has_value(), RuntimeError, "Sharded checkpoint ", folder_.string(), ": ",
               shard_file_name(part, layout_.parts), " lacks tensor ", path, ".");
      int64_t held = 1;
      for (int64_t size : tensor->sizes) held *= size;
      const bool contiguous = tensor->strides.size() == 1 && (tensor->strides[0] == 1 || held <= 1);
      LF_CHECK(held == slice.length && contiguous && tensor->storage_type == storage_type, RuntimeError,
               "Sharded checkpoint ", folder_.string(), ": ", shard_file_name(part, layout_.parts), " holds ", held,
               " values of ", path, " (", tensor->storage_type, "), expected ", slice.length,
               " contiguous values (", storage_type, ") as metadata.json says.");
      if (slice.length == 0) continue;
      const zip::Entry& entry = shard.record(tensor->key);
      const uint64_t begin = static_cast<uint64_t>(tensor->offset) * element_size;
      const uint64_t size = static_cast<uint64_t>(slice.length) * element_size;
      LF_CHECK(begin + size <= entry.size, RuntimeError, shard.what, " is truncated: tensor ", path, " needs ",
               begin + size, " bytes of its record, which holds ", entry.size, ".");
      const uint32_t crc = begin == 0 && size == entry.size
                               ? entry.crc32  // verified above
                               : zip::crc32(shard.reader.content(entry).substr(begin, size));
      record.crc32 = zip::combine_crc32(record.crc32, crc, size);
      record.pieces.push_back(shard.range(entry, begin, size));
    }
    pickle::TensorRecord whole;
    whole.storage_type = storage_type;
    whole.storage_numel = layout.numel();
    whole.sizes = layout.shape;
    whole.strides = contiguous_strides(layout.shape);
    whole.key = output_.add_record(std::move(record));
    return pickle::make_tensor(whole);
  }

  fs::path folder_;
  ShardedLayout layout_;
  std::unique_ptr<Archive> common_;
  std::vector<std::unique_ptr<Archive>> shards_;
  OutputArchive output_;
};
// A torch.distributed.checkpoint folder (dcp_format.h) as one file: the nested state rebuilt from
// the keys' paths, every tensor whole, and meta.pt's entries at the top level, as Python's
// dcp_to_torch_save plus Lightning's meta.pt give.
class DcpSplicer {
 public:
  explicit DcpSplicer(const fs::path& folder) : folder_(folder), metadata_(dcp::read_metadata(folder)) {}

  ConsolidateSummary write(const fs::path& output, bool force_zip64) {
    NodePtr root = pickle::make_node(Node::Kind::Dict);
    ConsolidateSummary summary;
    for (const std::string& key : metadata_.order) {
      const dcp::Item& item = metadata_.items.at(key);
      NodePtr value = item.kind == dcp::Item::Kind::Bytes ? bytes_value(key, item) : tensor_value(key, item);
      if (item.kind == dcp::Item::Kind::Tensor) ++summary.tensors;
      place(root, item.path.empty() ? std::vector<dcp::PathElement>{{key, -1}} : item.path, value);
    }
    const fs::path meta = folder_ / dcp::kLightningMetaFile;
    if (fs::is_regular_file(meta)) {
      const Archive& archive = *archives_.emplace_back(std::make_unique<Archive>(meta, "Checkpoint " + meta.string()));
      Node* entries = pickle::as_dict(archive.root);
      LF_CHECK(entries != nullptr, RuntimeError, archive.what, " does not hold a dictionary.");
      output_.adopt_tensors(archive.root, archive);
      for (size_t i = 0; i + 1 < entries->items.size(); i += 2) {
        place(root, {{entries->items[i]->text, -1}}, entries->items[i + 1]);
      }
    }
    std::vector<const Archive*> inputs;
    for (const auto& archive : archives_) inputs.push_back(archive.get());
    summary.bytes = output_.write(output, *root, inputs, "3\n", force_zip64);
    return summary;
  }

 private:
  const Archive& item_archive(const dcp::Location& location, const std::string& key) {
    auto file = files_.find(location.file);
    if (file == files_.end()) {
      const fs::path path = folder_ / location.file;
      LF_CHECK(fs::is_regular_file(path), RuntimeError, "Checkpoint ", folder_.string(), " is incomplete: ",
               location.file, " (holding ", key, ") is missing.");
      file = files_.emplace(location.file, std::make_shared<zip::MappedFile>(path)).first;
    }
    LF_CHECK(location.offset + location.length <= file->second->bytes().size(), RuntimeError, "Checkpoint ",
             folder_.string(), ": ", location.file, " is truncated: ", key, " needs bytes up to ",
             location.offset + location.length, ", the file has ", file->second->bytes().size(), ".");
    return *archives_.emplace_back(std::make_unique<Archive>(file->second, location.offset, location.length,
                                                             "Checkpoint " + (folder_ / location.file).string() + " (" + key + ")"));
  }

  NodePtr bytes_value(const std::string& key, const dcp::Item& item) {
    const Archive& archive = item_archive(item.locations[0], key);
    output_.adopt_tensors(archive.root, archive);
    return archive.root;
  }

  // Each chunk's record as it lies when the chunks are flat ranges that tile the tensor in order
  // (what fsdp and FSDP2's dim-0 shards write); otherwise the tensor is assembled in memory.
  NodePtr tensor_value(const std::string& key, const dcp::Item& item) {
    const int size = dcp::dtype_size(item.dtype);
    const std::string storage_type = pickle::storage_type_of(item.dtype);
    LF_CHECK(size > 0 && !storage_type.empty(), RuntimeError, "Checkpoint ", folder_.string(), ": ", key,
             " has dtype ", item.dtype, ", which consolidation does not support.");
    int64_t numel = 1;
    for (int64_t extent : item.size) numel *= extent;
    struct Piece {
      int64_t flat_begin;
      size_t chunk;
    };
    std::vector<Piece> pieces;
    bool tiles = true;
    for (size_t c = 0; c < item.chunks.size(); ++c) {
      const auto& box = item.chunks[c];
      if (box.numel() == 0) continue;
      const auto as_range = dcp::flat_range_boxes(item.size, flat_index(item.size, box.offsets), box.numel());
      tiles &= as_range.size() == 1 && as_range[0] == box;
      pieces.push_back({flat_index(item.size, box.offsets), c});
    }
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.flat_begin < b.flat_begin; });
    int64_t next = 0;
    for (const Piece& piece : pieces) {
      tiles &= piece.flat_begin == next;
      next = piece.flat_begin + item.chunks[piece.chunk].numel();
    }
    tiles &= next == numel;
    Record record;
    if (!tiles) record.content.assign(static_cast<size_t>(numel * size), '\0');
    int64_t covered = 0;
    for (const Piece& piece : pieces) {
      const dcp::Box& box = item.chunks[piece.chunk];
      const Archive& archive = item_archive(item.locations[piece.chunk], key);
      const auto tensor = pickle::as_tensor(*archive.root);
      LF_CHECK(tensor && tensor->sizes == box.sizes && tensor->storage_type == storage_type &&
                   is_contiguous(box.sizes, tensor->strides),
               RuntimeError, archive.what, " does not hold a contiguous ", storage_type, " of the chunk's shape.");
      const zip::Entry& entry = archive.record(tensor->key);
      const uint64_t begin = static_cast<uint64_t>(tensor->offset) * size, bytes = static_cast<uint64_t>(box.numel()) * size;
      LF_CHECK(begin + bytes <= entry.size, RuntimeError, archive.what, " is truncated.");
      const std::string_view data = archive.reader.content(entry).substr(begin, bytes);
      if (tiles) {
        const uint32_t crc = begin == 0 && bytes == entry.size ? entry.crc32 : zip::crc32(data);  // whole: verified later
        record.crc32 = zip::combine_crc32(record.crc32, crc, bytes);
        record.pieces.push_back(archive.range(entry, begin, bytes));
      } else {
        place_box(record.content, item.size, box, data, size);
      }
      covered += box.numel();
    }
    LF_CHECK(covered == numel, RuntimeError, "Checkpoint ", folder_.string(), ": the chunks of ", key, " hold ", covered,
             " of its ", numel, " elements; the checkpoint is incomplete.");
    pickle::TensorRecord whole;
    whole.storage_type = storage_type;
    whole.storage_numel = numel;
    whole.sizes = item.size;
    whole.strides = contiguous_strides(item.size);
    whole.key = output_.add_record(std::move(record));
    return pickle::make_tensor(whole);
  }

  // Row-major, ignoring the strides of dimensions of extent 1 (which any value may have).
  static bool is_contiguous(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
    if (strides.size() != sizes.size()) return false;
    int64_t expected = 1;
    for (size_t d = sizes.size(); d-- > 0;) {
      if (sizes[d] != 1 && strides[d] != expected) return false;
      expected *= sizes[d];
    }
    return true;
  }

  static int64_t flat_index(const std::vector<int64_t>& shape, const std::vector<int64_t>& at) {
    int64_t index = 0;
    for (size_t d = 0; d < shape.size(); ++d) index = index * shape[d] + at[d];
    return index;
  }

  // Copies a box's contiguous bytes into its place in a row-major buffer, one innermost row at a time.
  static void place_box(std::string& whole, const std::vector<int64_t>& shape, const dcp::Box& box, std::string_view data,
                        int size) {
    const size_t dims = shape.size();
    if (dims == 0) {
      whole.replace(0, data.size(), data);
      return;
    }
    const int64_t row = box.sizes[dims - 1] * size;
    std::vector<int64_t> at(dims, 0);
    for (int64_t done = 0; done * row < static_cast<int64_t>(data.size()); ++done) {
      std::vector<int64_t> index(dims);
      for (size_t d = 0; d < dims; ++d) index[d] = box.offsets[d] + at[d];
      std::memcpy(&whole[static_cast<size_t>(flat_index(shape, index) * size)], data.data() + done * row, static_cast<size_t>(row));
      for (size_t d = dims - 1; d-- > 0;) {  // the next row: odometer over the outer dimensions
        if (++at[d] < box.sizes[d]) break;
        at[d] = 0;
      }
    }
  }

  // Puts value at a key path, creating dicts (string elements) and lists (index elements).
  static void place(const NodePtr& root, const std::vector<dcp::PathElement>& path, NodePtr value) {
    NodePtr node = root;
    for (size_t i = 0; i < path.size(); ++i) {
      const bool last = i + 1 == path.size();
      const bool next_is_index = !last && path[i + 1].index >= 0;
      NodePtr* slot = nullptr;
      if (path[i].index >= 0) {
        LF_CHECK(node->kind == Node::Kind::List, RuntimeError, "Checkpoint key ", dcp::flat_key(path), " mixes lists and dicts.");
        while (node->items.size() <= static_cast<size_t>(path[i].index)) node->items.push_back(pickle::make_node(Node::Kind::None));
        slot = &node->items[static_cast<size_t>(path[i].index)];
        if (!last && (*slot)->kind == Node::Kind::None) *slot = next_is_index ? pickle::make_node(Node::Kind::List) : pickle::make_node(Node::Kind::Dict);
      } else {
        Node* dict = pickle::as_dict(node);
        LF_CHECK(dict != nullptr, RuntimeError, "Checkpoint key ", dcp::flat_key(path), " mixes lists and dicts.");
        slot = pickle::dict_find(*dict, path[i].key);
        if (slot == nullptr) {
          dict->items.push_back(pickle::make_string(path[i].key));
          dict->items.push_back(last ? value : next_is_index ? pickle::make_node(Node::Kind::List) : pickle::make_node(Node::Kind::Dict));
          slot = &dict->items.back();
        }
      }
      if (last) *slot = value;
      node = *slot;
    }
  }

  fs::path folder_;
  dcp::Metadata metadata_;
  std::map<std::string, std::shared_ptr<zip::MappedFile>> files_;
  std::vector<std::unique_ptr<Archive>> archives_;
  OutputArchive output_;
};
}  // namespace

ConsolidateSummary consolidate_sharded_folder(const fs::path& folder, const fs::path& output, bool force_zip64) {
  if (dcp::is_dcp_checkpoint(folder)) return DcpSplicer(folder).write(output, force_zip64);
  Splicer splicer(folder);
  return splicer.write(output, force_zip64);
}

}  // namespace lightning::fabric
