#include "lightning/fabric/checkpoint/consolidate.h"

#include <map>
#include <memory>
#include <set>
#include <thread>
#include <sstream>

#include "lightning/fabric/checkpoint/atomic_file.h"
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
  Archive(const fs::path& path, const std::string& what) : file(path), reader(file.bytes(), what), what(what) {
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
  zip::MappedFile file;
  zip::Reader reader;
  std::string what, prefix;
  NodePtr root;
};

struct Record {
  std::vector<zip::FileRange> pieces;
  uint32_t crc32 = 0;
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
      dict->items.push_back(i + 1 == elements.size() ? value : pickle::make_tagged_dict());
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
    renumber_common_tensors(common_->root);
    for (const auto& [path, tensor] : layout_.tensors) insert_at_path(common_->root, path, assemble(path, tensor));
    ConsolidateSummary summary;
    summary.tensors = static_cast<int64_t>(layout_.tensors.size());
    const zip::Entry* version = common_->reader.find(common_->prefix + "version");
    const std::string version_text = version ? std::string(common_->reader.content(*version)) : "3\n";
    write_file_atomically_fd(output, [&](int fd) {
      // The records' checksums are verified on the second core while the kernel copies their
      // bytes; the output only takes its name once both are done.
      std::exception_ptr corrupted;
      std::thread verifier([&] {
        try {
          common_->reader.verify_all();
          for (const auto& shard : shards_) shard->reader.verify_all();
        } catch (...) {
          corrupted = std::current_exception();
        }
      });
      try {
        zip::Writer writer(fd, output.string(), force_zip64);
        writer.add("archive/data.pkl", pickle::write(*common_->root));
        for (size_t key = 0; key < records_.size(); ++key) {
          writer.add("archive/data/" + std::to_string(key), records_[key].pieces, records_[key].crc32);
        }
        writer.add("archive/version", version_text);
        writer.finish();
        summary.bytes = writer.bytes_written();
      } catch (...) {
        verifier.join();
        throw;
      }
      verifier.join();
      if (corrupted) std::rethrow_exception(corrupted);
    });
    return summary;
  }

 private:
  std::string add_record(Record record) {
    records_.push_back(std::move(record));
    return std::to_string(records_.size() - 1);
  }

  // The tensors left in common.pt (buffers, small values) keep their bytes; their records are renumbered.
  void renumber_common_tensors(const NodePtr& node) {
    if (!node || !visited_.insert(node.get()).second) return;
    if (auto tensor = pickle::as_tensor(*node)) {
      auto found = common_keys_.find(tensor->key);
      if (found == common_keys_.end()) {
        const zip::Entry& entry = common_->record(tensor->key);
        const std::string key = add_record({{{common_->file.fd(), entry.data_offset, entry.size}}, entry.crc32});
        found = common_keys_.emplace(tensor->key, key).first;
      }
      pickle::set_tensor_key(*node, found->second);
      return;
    }
    for (const auto& item : node->items) renumber_common_tensors(item);
  }

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
      record.pieces.push_back({shard.file.fd(), entry.data_offset + begin, size});
    }
    pickle::TensorRecord whole;
    whole.storage_type = storage_type;
    whole.storage_numel = layout.numel();
    whole.sizes = layout.shape;
    whole.strides = contiguous_strides(layout.shape);
    whole.key = add_record(std::move(record));
    return pickle::make_tensor(whole);
  }

  fs::path folder_;
  ShardedLayout layout_;
  std::unique_ptr<Archive> common_;
  std::vector<std::unique_ptr<Archive>> shards_;
  std::vector<Record> records_;
  std::map<std::string, std::string> common_keys_;
  std::set<const Node*> visited_;
};
}  // namespace

ConsolidateSummary consolidate_sharded_folder(const fs::path& folder, const fs::path& output, bool force_zip64) {
  Splicer splicer(folder);
  return splicer.write(output, force_zip64);
}

}  // namespace lightning::fabric
