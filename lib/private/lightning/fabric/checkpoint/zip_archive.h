// The zip container of torch.save / torch::pickle_save files: entries stored uncompressed, each
// with its CRC-32, data aligned to 64 bytes. Reading maps the file and checks every offset;
// writing streams to a file descriptor and copies tensor bytes from other archives inside the
// kernel (copy_file_range), so merging checkpoints never touches the bytes in user space. ZIP64
// is read and written. Nothing here uses LibTorch: `lightning-run model consolidate` links it
// without loading LibTorch. Errors are RuntimeError naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace lightning::fabric::zip {

struct Entry {
  std::string name;
  uint64_t data_offset = 0;  // from the start of the file
  uint64_t size = 0;
  uint32_t crc32 = 0;
  bool stored = true;  // uncompressed
};

/// A read-only mapping of a whole file (empty files map to nothing). Move-only.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile& operator=(MappedFile&&) = delete;
  std::string_view bytes() const { return {data_, size_}; }
  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const char* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

/// The entry table of an archive held in memory. `what` names the file in errors.
class Reader {
 public:
  Reader(std::string_view bytes, std::string what);
  const std::vector<Entry>& entries() const { return entries_; }
  /// The entry of that name, or nullptr.
  const Entry* find(std::string_view name) const;
  /// The first entry whose name ends with suffix ("/data.pkl"), or nullptr.
  const Entry* find_suffix(std::string_view suffix) const;
  std::string_view content(const Entry& entry) const { return bytes_.substr(entry.data_offset, entry.size); }
  /// RuntimeError ("corrupted") when a stored entry's bytes do not match its CRC-32.
  void verify(const Entry& entry) const;
  void verify_all() const;

 private:
  std::string_view bytes_;
  std::string what_;
  std::vector<Entry> entries_;
};

/// Bytes [offset, offset + size) of an open file.
struct FileRange {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t size = 0;
};

/// Writes an archive to an open, empty file. Call finish() once, after the last entry.
class Writer {
 public:
  /// force_zip64 writes ZIP64 records even for small archives (tests of the large-file path).
  explicit Writer(int fd, std::string what, bool force_zip64 = false);
  void add(const std::string& name, std::string_view content);
  /// An entry made of byte ranges of other files, in order; crc32 is the CRC of their
  /// concatenation (see combine_crc32).
  void add(const std::string& name, const std::vector<FileRange>& pieces, uint32_t crc32);
  void finish();
  uint64_t bytes_written() const { return position_; }

 private:
  void write_header(const std::string& name, uint64_t size, uint32_t crc32);
  void write_bytes(std::string_view bytes);
  void copy_range(const FileRange& range);

  struct Written {
    std::string name;
    uint64_t header_offset, size;
    uint32_t crc32;
  };
  int fd_;
  std::string what_;
  bool force_zip64_;
  uint64_t position_ = 0;
  std::vector<Written> written_;
};

uint32_t crc32(std::string_view bytes);
/// CRC-32 of A followed by B, from crc(A), crc(B) and B's length.
uint32_t combine_crc32(uint32_t first, uint32_t second, uint64_t second_size);

}  // namespace lightning::fabric::zip
