#include "lightning/fabric/checkpoint/checkpoint_io.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cstring>
#include <memory>

#include "lightning/fabric/checkpoint/zip_archive.h"
#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

namespace {
// A checkpoint file mapped into memory; the zip reader copies records straight from the mapping.
class MappedCheckpoint : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit MappedCheckpoint(const fs::path& path) : file_(path) {}
  size_t size() const override { return file_.bytes().size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* = "") const override {
    const std::string_view bytes = file_.bytes();
    if (pos >= bytes.size()) return 0;
    n = std::min<size_t>(n, bytes.size() - pos);
    std::memcpy(buf, bytes.data() + pos, n);
    return n;
  }
  std::string_view bytes() const { return file_.bytes(); }

 private:
  zip::MappedFile file_;
};
}  // namespace

void save_state_dict_file(const fs::path& path, const StateDict& state) {
  // torch::pickle_save's layout (what torch.load reads), streamed to the file instead of memory.
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
                              nullptr, nullptr, nullptr);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(state));
  pickler.stop();
  write_file_atomically(path, [&](const ByteSink& sink) {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
      sink(data, size);
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  });
}

StateDict load_state_dict_file(const fs::path& path) {
  LF_CHECK(fs::exists(path), RuntimeError, "Checkpoint ", path.string(), " does not exist. Check the path (the ",
           "current folder is ", fs::current_path().string(), ").");
  LF_CHECK(!fs::is_directory(path), RuntimeError, "Checkpoint ", path.string(), " is a folder, not a checkpoint file",
           " (a sharded checkpoint? load it with the strategy that wrote it, or merge it with `lightning-run model ",
           "consolidate ", path.string(), "`).");
  auto file = std::make_shared<MappedCheckpoint>(path);
  // LibTorch's reader ignores the entries' CRC-32: check them, so that a flipped byte inside a
  // tensor is an error rather than a wrong value.
  zip::Reader(file->bytes(), "Checkpoint " + path.string()).verify_all();
  c10::IValue value;
  try {
    caffe2::serialize::PyTorchStreamReader reader(file);
    value = torch::jit::readArchiveAndTensors("data", "", "", c10::nullopt, c10::nullopt, c10::nullopt, reader);
  } catch (const c10::Error& error) {
    const std::string detail = error.what_without_backtrace();
    throw RuntimeError("Checkpoint " + path.string() + " (" + std::to_string(file->size()) +
                       " bytes) is not a readable checkpoint: it is truncated, corrupted or in another format (" +
                       detail.substr(0, detail.find('\n')) + ").");
  }
  LF_CHECK(value.isGenericDict(), RuntimeError, "Checkpoint ", path.string(), " holds a ", value.tagKind(),
           ", not a dictionary of state.");
  return value.toGenericDict();
}

}  // namespace lightning::fabric
