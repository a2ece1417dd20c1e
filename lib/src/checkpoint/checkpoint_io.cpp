#include "lightning/fabric/checkpoint/checkpoint_io.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>

#include "lightning/fabric/checkpoint/atomic_file.h"
#include "lightning/fabric/checkpoint/pickle_tree.h"
#include "lightning/fabric/checkpoint/zip_archive.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/storage/object_store.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

namespace {
// An archive held in memory (a mapped file, or a range of one); LibTorch's zip reader copies
// records straight from it. The bytes must outlive the adapter.
class ArchiveBytes : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit ArchiveBytes(std::string_view bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* = "") const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  std::string_view bytes_;
};
}  // namespace

namespace {
// The same value with every list generic: typed lists (c10::List<int64_t>, <double>, ...) pickle
// as torch.jit globals that torch.load's weights_only=True refuses. Tensors are shared, not copied.
c10::IValue plain(const c10::IValue& value) {
  if (value.isGenericDict()) {
    c10::impl::GenericDict out(c10::AnyType::get(), c10::AnyType::get());
    for (const auto& item : value.toGenericDict()) out.insert(plain(item.key()), plain(item.value()));
    return out;
  }
  if (value.isList()) {
    c10::impl::GenericList out(c10::AnyType::get());
    for (const c10::IValue item : value.toList()) out.push_back(plain(item));
    return out;
  }
  return value;
}

// The archive's data.pkl through LibTorch's unpickler, after pickle::plain_dicts: files written by
// Python (torch.save, Python Fabric) hold OrderedDicts, which LibTorch alone reads as None.
c10::IValue unpickle_archive(caffe2::serialize::PyTorchStreamReader& reader, const std::string& what) {
  const auto [data, size] = reader.getRecord("data.pkl");
  const std::string_view original(static_cast<const char*>(data.get()), size);
  const std::string pickled = pickle::write(*pickle::plain_dicts(pickle::parse(original, what)));
  size_t at = 0;
  torch::jit::Unpickler unpickler(
      [&](char* buffer, size_t wanted) {
        const size_t n = std::min(wanted, pickled.size() - at);
        std::memcpy(buffer, pickled.data() + at, n);
        at += n;
        return n;
      },
      nullptr, nullptr, [&](const std::string& name) { return std::get<0>(reader.getRecord("data/" + name)); },
      std::nullopt);
  return unpickler.parse_ivalue();
}
}  // namespace

namespace {
// torch::pickle_save's layout (what torch.load reads), streamed to `write` instead of memory.
// Untagged aggregates: a type tag is a torch.jit global that torch.load's default
// weights_only=True refuses, so Python could not load the file without opting out.
void write_archive(const c10::IValue& value, const std::function<void(const void*, size_t)>& write) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
                              nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(plain(value));
  pickler.stop();
  // A failing `write` (a full disk) must not throw through LibTorch's writer, whose destructor
  // would then finish the archive and throw again (std::terminate): the first failure is kept,
  // the rest of the archive goes nowhere, and the failure is raised once the writer is done.
  std::exception_ptr failure;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
      if (failure) return size;
      try {
        write(data, size);
      } catch (...) {
        failure = std::current_exception();
      }
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  }
  if (failure) std::rethrow_exception(failure);
}

c10::IValue read_archive(std::string_view bytes, const std::string& what) {
  // LibTorch's reader ignores the entries' CRC-32: check them, so that a flipped byte inside a
  // tensor is an error rather than a wrong value.
  zip::Reader(bytes, what).verify_all();
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<ArchiveBytes>(bytes));
    return unpickle_archive(reader, what);
  } catch (const c10::Error& error) {
    const std::string detail = error.what_without_backtrace();
    throw RuntimeError(what + " (" + std::to_string(bytes.size()) +
                       " bytes) is not a readable checkpoint: it is truncated, corrupted or in another format (" +
                       detail.substr(0, detail.find('\n')) + ").");
  }
}
}  // namespace

void save_state_dict_file(const fs::path& path, const StateDict& state) {
  storage::refuse_unknown_schemes(path.string(), "fabric.save(" + path.string() + ")");
  if (storage::is_object_url(path.string())) {  // one put: the object appears whole or not at all
    const storage::ObjectAddress object = storage::object_address(path.string(), "fabric.save(" + path.string() + ")");
    object.store->put(object.key, archive_bytes(c10::IValue(state)));
    return;
  }
  write_file_atomically(path, [&](const ByteSink& sink) { write_archive(c10::IValue(state), sink); });
}

std::string archive_bytes(const c10::IValue& value) {
  std::string out;
  write_archive(value, [&](const void* data, size_t size) { out.append(static_cast<const char*>(data), size); });
  return out;
}

void stream_archive(const c10::IValue& value, const std::function<void(const void* data, size_t size)>& sink) {
  write_archive(value, sink);
}

c10::IValue value_of_archive(std::string_view bytes, const std::string& what) { return read_archive(bytes, what); }

StateDict load_state_dict_file(const fs::path& path) {
  storage::refuse_unknown_schemes(path.string(), "fabric.load(" + path.string() + ")");
  if (storage::is_object_url(path.string())) {
    const storage::ObjectAddress object = storage::object_address(path.string(), "fabric.load(" + path.string() + ")");
    const std::string bytes = object.store->get(object.key);
    const c10::IValue value = read_archive(bytes, "Checkpoint " + path.string());
    LF_CHECK(value.isGenericDict(), RuntimeError, "Checkpoint ", path.string(), " holds a ", value.tagKind(),
             ", not a dictionary of state.");
    return value.toGenericDict();
  }
  LF_CHECK(fs::exists(path), RuntimeError, "Checkpoint ", path.string(), " does not exist. Check the path (the ",
           "current folder is ", fs::current_path().string(), ").");
  LF_CHECK(!fs::is_directory(path), RuntimeError, "Checkpoint ", path.string(), " is a folder, not a checkpoint file",
           " (a sharded checkpoint? load it with the strategy that wrote it, or merge it with `lightning-run model ",
           "consolidate ", path.string(), "`).");
  const zip::MappedFile file(path);
  const c10::IValue value = read_archive(file.bytes(), "Checkpoint " + path.string());
  LF_CHECK(value.isGenericDict(), RuntimeError, "Checkpoint ", path.string(), " holds a ", value.tagKind(),
           ", not a dictionary of state.");
  return value.toGenericDict();
}

}  // namespace lightning::fabric
