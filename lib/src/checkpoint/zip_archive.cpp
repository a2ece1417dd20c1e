#include "lightning/fabric/checkpoint/zip_archive.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "lightning/fabric/checkpoint/file_bytes.h"
#include "lightning/fabric/errors.h"

namespace lightning::fabric::zip {

namespace {
constexpr uint32_t kLocalSignature = 0x04034b50, kCentralSignature = 0x02014b50, kEndSignature = 0x06054b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50, kZip64LocatorSignature = 0x07064b50;
constexpr uint64_t kLocalHeader = 30, kCentralHeader = 46, kEndRecord = 22, kZip64EndRecord = 56, kZip64Locator = 20;
constexpr uint32_t kOverflow32 = 0xFFFFFFFFu;
constexpr uint16_t kZip64ExtraId = 0x0001, kPaddingExtraId = 0x4246;  // "FB", PyTorch's alignment padding
constexpr uint64_t kAlignment = 64;

using internal::append_le;
using internal::read_le;
using internal::system_error_text;
}  // namespace

uint32_t crc32(std::string_view bytes) {
  return static_cast<uint32_t>(crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

uint32_t combine_crc32(uint32_t first, uint32_t second, uint64_t second_size) {
  return static_cast<uint32_t>(crc32_combine64(first, second, static_cast<z_off64_t>(second_size)));
}

// ---- reading ---------------------------------------------------------------------------------

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LF_CHECK(fd_ >= 0, RuntimeError, "Cannot read ", path.string(), ": ", system_error_text(), ".");
  struct stat info {};
  ::fstat(fd_, &info);
  size_ = static_cast<size_t>(info.st_size);
  if (size_ == 0) return;
  void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (mapped == MAP_FAILED) {
    const std::string reason = system_error_text();
    ::close(fd_);
    throw RuntimeError("Cannot map " + path.string() + ": " + reason + ".");
  }
  data_ = static_cast<const char*>(mapped);
  ::madvise(mapped, size_, MADV_SEQUENTIAL);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_), fd_(other.fd_) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.fd_ = -1;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

Reader::Reader(std::string_view bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {
  auto fail = [&](const std::string& why) {
    throw RuntimeError(what_ + " (" + std::to_string(bytes_.size()) + " bytes) is not a readable checkpoint: " + why +
                       ". It is truncated, corrupted or in another format.");
  };
  // Whether [offset, offset + length) lies inside the file, without overflowing.
  const auto fits = [&](uint64_t offset, uint64_t length) {
    return offset <= bytes_.size() && length <= bytes_.size() - offset;
  };
  if (bytes_.size() < kEndRecord) fail("too short for a zip archive");
  uint64_t end = bytes_.size() - kEndRecord;
  const uint64_t lowest = bytes_.size() > kEndRecord + 65535 ? bytes_.size() - kEndRecord - 65535 : 0;
  while (end > lowest && read_le(bytes_, end, 4) != kEndSignature) --end;
  if (read_le(bytes_, end, 4) != kEndSignature) fail("no end-of-archive record");
  uint64_t count = read_le(bytes_, end + 10, 2), at = read_le(bytes_, end + 16, 4);
  if (count == 0xFFFF || at == kOverflow32) {  // ZIP64: the real values sit in the ZIP64 end record
    if (end < kZip64Locator || read_le(bytes_, end - kZip64Locator, 4) != kZip64LocatorSignature) fail("no ZIP64 locator");
    const uint64_t record = read_le(bytes_, end - kZip64Locator + 8, 8);
    if (!fits(record, kZip64EndRecord) || read_le(bytes_, record, 4) != kZip64EndSignature) {
      fail("a broken ZIP64 end record");
    }
    count = read_le(bytes_, record + 32, 8);
    at = read_le(bytes_, record + 48, 8);
  }
  for (uint64_t i = 0; i < count; ++i) {
    if (!fits(at, kCentralHeader) || read_le(bytes_, at, 4) != kCentralSignature) fail("a broken entry table");
    Entry entry;
    entry.stored = read_le(bytes_, at + 10, 2) == 0;
    entry.crc32 = static_cast<uint32_t>(read_le(bytes_, at + 16, 4));
    uint64_t compressed = read_le(bytes_, at + 20, 4), size = read_le(bytes_, at + 24, 4);
    uint64_t local = read_le(bytes_, at + 42, 4);
    const uint64_t name_length = read_le(bytes_, at + 28, 2), extra_length = read_le(bytes_, at + 30, 2);
    const uint64_t comment_length = read_le(bytes_, at + 32, 2);
    if (!fits(at, kCentralHeader + name_length + extra_length)) fail("a broken entry table");
    entry.name = std::string(bytes_.substr(at + kCentralHeader, name_length));
    // ZIP64 extra field: the 64-bit values of the fields that hold 0xFFFFFFFF, in this order.
    for (uint64_t extra = at + kCentralHeader + name_length; extra + 4 <= at + kCentralHeader + name_length + extra_length;) {
      const uint64_t id = read_le(bytes_, extra, 2), length = read_le(bytes_, extra + 2, 2);
      uint64_t field = extra + 4;
      if (id == kZip64ExtraId) {
        for (uint64_t* value : {&size, &compressed, &local}) {
          if (*value == kOverflow32 && field + 8 <= extra + 4 + length && fits(field, 8)) {
            *value = read_le(bytes_, field, 8);
            field += 8;
          }
        }
      }
      extra += 4 + length;
    }
    at += kCentralHeader + name_length + extra_length + comment_length;
    if (!fits(local, kLocalHeader) || read_le(bytes_, local, 4) != kLocalSignature) {
      fail("entry " + entry.name + " has no header");
    }
    entry.data_offset = local + kLocalHeader + read_le(bytes_, local + 26, 2) + read_le(bytes_, local + 28, 2);
    entry.size = entry.stored ? size : compressed;
    if (!fits(entry.data_offset, entry.size)) {
      throw RuntimeError(what_ + " is truncated: entry " + entry.name + " ends past the end of the file (" +
                         std::to_string(bytes_.size()) + " bytes).");
    }
    entries_.push_back(std::move(entry));
  }
}

const Entry* Reader::find(std::string_view name) const {
  for (const auto& entry : entries_) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

const Entry* Reader::find_suffix(std::string_view suffix) const {
  for (const auto& entry : entries_) {
    if (entry.name.size() >= suffix.size() && entry.name.compare(entry.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return &entry;
    }
  }
  return nullptr;
}

void Reader::verify(const Entry& entry) const {
  if (!entry.stored) return;  // compressed entries are checked by the reader that inflates them
  LF_CHECK(crc32(content(entry)) == entry.crc32, RuntimeError, what_, " is corrupted: the checksum of entry ", entry.name,
           " does not match its content. Restore the file from a copy, or use an earlier checkpoint.");
}

void Reader::verify_all() const {
  for (const auto& entry : entries_) verify(entry);
}

// ---- writing ---------------------------------------------------------------------------------

Writer::Writer(int fd, std::string what, bool force_zip64) : fd_(fd), what_(std::move(what)), force_zip64_(force_zip64) {}

void Writer::write_bytes(std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t count = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(position_ + done));
    if (count < 0 && errno == EINTR) continue;
    LF_CHECK(count > 0, RuntimeError, "Writing ", what_, " failed: ", system_error_text(), ".");
    done += static_cast<size_t>(count);
  }
  position_ += bytes.size();
}

void Writer::copy_range(const FileRange& range) {
  loff_t in = static_cast<loff_t>(range.offset), out = static_cast<loff_t>(position_);
  uint64_t left = range.size;
  while (left > 0) {  // in-kernel copy first; plain reads and writes where the kernel refuses
    const ssize_t count = ::copy_file_range(range.fd, &in, fd_, &out, left, 0);
    if (count < 0 && errno == EINTR) continue;
    if (count < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) break;
    LF_CHECK(count > 0, RuntimeError, "Writing ", what_, " failed while copying tensor data: ",
             count == 0 ? std::string("the source ended early") : system_error_text(), ".");
    left -= static_cast<uint64_t>(count);
  }
  std::vector<char> buffer(left > 0 ? (1 << 20) : 0);
  while (left > 0) {
    const ssize_t count = ::pread(range.fd, buffer.data(), std::min<uint64_t>(left, buffer.size()), in);
    if (count < 0 && errno == EINTR) continue;
    LF_CHECK(count > 0, RuntimeError, "Writing ", what_, " failed while reading tensor data: ",
             count == 0 ? std::string("the source ended early") : system_error_text(), ".");
    position_ = static_cast<uint64_t>(out);
    write_bytes(std::string_view(buffer.data(), static_cast<size_t>(count)));
    in += count;
    out += count;
    left -= static_cast<uint64_t>(count);
  }
  position_ = static_cast<uint64_t>(out);
}

void Writer::write_header(const std::string& name, uint64_t size, uint32_t crc32) {
  const bool zip64 = force_zip64_ || size >= kOverflow32;
  const uint64_t zip64_extra = zip64 ? 20 : 0;
  const uint64_t unpadded = position_ + kLocalHeader + name.size() + zip64_extra + 4;
  const uint64_t padding = (kAlignment - unpadded % kAlignment) % kAlignment;
  std::string header;
  append_le(header, kLocalSignature, 4);
  append_le(header, zip64 ? 45 : 20, 2);  // version needed
  append_le(header, 0, 2);                // flags
  append_le(header, 0, 2);                // stored
  append_le(header, 0, 4);                // time and date
  append_le(header, crc32, 4);
  append_le(header, zip64 ? kOverflow32 : size, 4);
  append_le(header, zip64 ? kOverflow32 : size, 4);
  append_le(header, name.size(), 2);
  append_le(header, zip64_extra + 4 + padding, 2);
  header += name;
  if (zip64) {
    append_le(header, kZip64ExtraId, 2);
    append_le(header, 16, 2);
    append_le(header, size, 8);
    append_le(header, size, 8);
  }
  append_le(header, kPaddingExtraId, 2);
  append_le(header, padding, 2);
  header.append(padding, 'Z');
  written_.push_back({name, position_, size, crc32});
  write_bytes(header);
}

void Writer::add(const std::string& name, std::string_view content) {
  write_header(name, content.size(), crc32(content));
  write_bytes(content);
}

void Writer::add(const std::string& name, const std::vector<FileRange>& pieces, uint32_t crc32) {
  uint64_t size = 0;
  for (const auto& piece : pieces) size += piece.size;
  write_header(name, size, crc32);
  for (const auto& piece : pieces) copy_range(piece);
}

void Writer::finish() {
  std::string table;
  for (const auto& entry : written_) {
    const bool size64 = force_zip64_ || entry.size >= kOverflow32;
    const bool offset64 = force_zip64_ || entry.header_offset >= kOverflow32;
    std::string extra;
    if (size64 || offset64) {
      append_le(extra, kZip64ExtraId, 2);
      append_le(extra, (size64 ? 16 : 0) + (offset64 ? 8 : 0), 2);
      if (size64) {
        append_le(extra, entry.size, 8);
        append_le(extra, entry.size, 8);
      }
      if (offset64) append_le(extra, entry.header_offset, 8);
    }
    append_le(table, kCentralSignature, 4);
    append_le(table, extra.empty() ? 20 : 45, 2);  // made by
    append_le(table, extra.empty() ? 20 : 45, 2);  // needed
    append_le(table, 0, 2);
    append_le(table, 0, 2);
    append_le(table, 0, 4);
    append_le(table, entry.crc32, 4);
    append_le(table, size64 ? kOverflow32 : entry.size, 4);
    append_le(table, size64 ? kOverflow32 : entry.size, 4);
    append_le(table, entry.name.size(), 2);
    append_le(table, extra.size(), 2);
    append_le(table, 0, 2);   // comment
    append_le(table, 0, 2);   // disk
    append_le(table, 0, 2);   // internal attributes
    append_le(table, 0, 4);   // external attributes
    append_le(table, offset64 ? kOverflow32 : entry.header_offset, 4);
    table += entry.name;
    table += extra;
  }
  const uint64_t table_offset = position_, count = written_.size();
  const bool zip64 = force_zip64_ || count >= 0xFFFF || table_offset >= kOverflow32 || table.size() >= kOverflow32;
  std::string end;
  if (zip64) {
    const uint64_t record = table_offset + table.size();
    append_le(end, kZip64EndSignature, 4);
    append_le(end, kZip64EndRecord - 12, 8);
    append_le(end, 45, 2);
    append_le(end, 45, 2);
    append_le(end, 0, 4);
    append_le(end, 0, 4);
    append_le(end, count, 8);
    append_le(end, count, 8);
    append_le(end, table.size(), 8);
    append_le(end, table_offset, 8);
    append_le(end, kZip64LocatorSignature, 4);
    append_le(end, 0, 4);
    append_le(end, record, 8);
    append_le(end, 1, 4);
  }
  append_le(end, kEndSignature, 4);
  append_le(end, 0, 4);
  append_le(end, zip64 ? 0xFFFF : count, 2);
  append_le(end, zip64 ? 0xFFFF : count, 2);
  append_le(end, zip64 ? kOverflow32 : table.size(), 4);
  append_le(end, zip64 ? kOverflow32 : table_offset, 4);
  append_le(end, 0, 2);
  write_bytes(table + end);
}

}  // namespace lightning::fabric::zip
