#include "lightning/fabric/checkpoint/checkpoint_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

namespace {
std::string system_reason() { return std::strerror(errno); }

void write_all(int fd, std::string_view bytes, const fs::path& temporary) {
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t count = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (count < 0 && errno == EINTR) continue;
    LF_CHECK(count > 0, RuntimeError, "Writing checkpoint file ", temporary.string(), " failed: ", system_reason(), ".");
    written += static_cast<size_t>(count);
  }
}

// A checkpoint file mapped into memory; the zip reader copies records straight from the mapping.
class MappedFile : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit MappedFile(const fs::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    LF_CHECK(fd >= 0, RuntimeError, "Cannot read checkpoint ", path.string(), ": ", system_reason(), ".");
    struct stat info {};
    ::fstat(fd, &info);
    size_ = static_cast<size_t>(info.st_size);
    if (size_ > 0) {
      void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      ::close(fd);
      LF_CHECK(mapped != MAP_FAILED, RuntimeError, "Cannot map checkpoint ", path.string(), ": ", system_reason(), ".");
      data_ = static_cast<const char*>(mapped);
      ::madvise(mapped, size_, MADV_SEQUENTIAL);
    } else {
      ::close(fd);
    }
  }
  ~MappedFile() override {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  }
  size_t size() const override { return size_; }
  size_t read(uint64_t pos, void* buf, size_t n, const char* = "") const override {
    if (pos >= size_) return 0;
    n = std::min<size_t>(n, size_ - pos);
    std::memcpy(buf, data_ + pos, n);
    return n;
  }
  const char* data() const { return data_; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

uint32_t little_endian(const char* bytes, size_t offset, int width) {
  uint32_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[offset + static_cast<size_t>(i)]);
  return value;
}

// The torch.save zip stores entries uncompressed with their CRC-32, which LibTorch's reader does
// not check: verify them, so a flipped byte inside a tensor is an error rather than a wrong value.
// Layouts it cannot follow (ZIP64, compressed entries) are left to the reader.
void verify_zip_checksums(const char* bytes, size_t length, const fs::path& path) {
  constexpr size_t kEndRecord = 22, kCentralHeader = 46, kLocalHeader = 30;
  struct View {
    const char* data;
    size_t length;
    size_t size() const { return length; }
  } view{bytes, length};
  if (view.size() < kEndRecord) return;
  size_t end = view.size() - kEndRecord;
  const size_t lowest = view.size() > kEndRecord + 65535 ? view.size() - kEndRecord - 65535 : 0;
  while (end > lowest && little_endian(bytes, end, 4) != 0x06054b50) --end;
  if (little_endian(bytes, end, 4) != 0x06054b50) return;
  const uint32_t entries = little_endian(bytes, end + 10, 2);
  size_t at = little_endian(bytes, end + 16, 4);
  if (entries == 0xFFFF || at == 0xFFFFFFFFu) return;
  for (uint32_t i = 0; i < entries; ++i) {
    if (at + kCentralHeader > view.size() || little_endian(bytes, at, 4) != 0x02014b50) return;
    const uint32_t method = little_endian(bytes, at + 10, 2), crc = little_endian(bytes, at + 16, 4);
    const uint32_t size = little_endian(bytes, at + 20, 4), local = little_endian(bytes, at + 42, 4);
    const size_t name_length = little_endian(bytes, at + 28, 2);
    const std::string name(bytes + at + kCentralHeader, std::min(name_length, view.size() - at - kCentralHeader));
    at += kCentralHeader + name_length + little_endian(bytes, at + 30, 2) + little_endian(bytes, at + 32, 2);
    if (method != 0 || size == 0xFFFFFFFFu || local == 0xFFFFFFFFu || local + kLocalHeader > view.size()) continue;
    const size_t data = local + kLocalHeader + little_endian(bytes, local + 26, 2) + little_endian(bytes, local + 28, 2);
    LF_CHECK(data + size <= view.size(), RuntimeError, "Checkpoint ", path.string(), " is truncated: entry ", name,
             " ends past the end of the file.");
    const auto actual = static_cast<uint32_t>(
        crc32_z(0, reinterpret_cast<const Bytef*>(bytes + data), static_cast<z_size_t>(size)));
    LF_CHECK(actual == crc, RuntimeError, "Checkpoint ", path.string(), " is corrupted: the checksum of entry ", name,
             " does not match its content. Restore the file from a copy, or use an earlier checkpoint.");
  }
}

void sync_folder(const fs::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the rename itself is atomic
  ::fsync(fd);
  ::close(fd);
}
}  // namespace

void write_file_atomically(const fs::path& path, const std::function<void(const ByteSink&)>& produce) {
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code error;
  fs::create_directories(folder, error);
  LF_CHECK(!error, RuntimeError, "Cannot create the folder ", folder.string(), " for checkpoint ", path.string(), ": ",
           error.message(), ".");
  LF_CHECK(!fs::is_directory(path), RuntimeError, "Cannot save a checkpoint file to ", path.string(),
           ": it is a folder. Choose a file name.");
  const fs::path temporary = folder / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LF_CHECK(fd >= 0, RuntimeError, "Cannot write checkpoint ", path.string(), ": creating ", temporary.string(),
           " failed: ", system_reason(), ".");
  try {
    produce([&](const void* data, size_t size) { write_all(fd, std::string_view(static_cast<const char*>(data), size), temporary); });
    LF_CHECK(::fsync(fd) == 0, RuntimeError, "Flushing checkpoint file ", temporary.string(), " failed: ",
             system_reason(), ".");
    LF_CHECK(::close(fd) == 0, RuntimeError, "Closing checkpoint file ", temporary.string(), " failed: ",
             system_reason(), ".");
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = system_reason();
    ::unlink(temporary.c_str());
    throw RuntimeError("Cannot move the finished checkpoint " + temporary.string() + " to " + path.string() + ": " +
                       reason + ".");
  }
  sync_folder(folder);
}

void write_file_atomically(const fs::path& path, std::string_view bytes) {
  write_file_atomically(path, [&](const ByteSink& sink) { sink(bytes.data(), bytes.size()); });
}

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
  auto file = std::make_shared<MappedFile>(path);
  verify_zip_checksums(file->data(), file->size(), path);
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
