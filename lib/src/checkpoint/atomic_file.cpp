#include "lightning/fabric/checkpoint/atomic_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "lightning/fabric/checkpoint/file_bytes.h"
#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

namespace {
using internal::system_error_text;

void sync_folder(const fs::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the rename itself is atomic
  ::fsync(fd);
  ::close(fd);
}
}  // namespace

void write_file_atomically_fd(const fs::path& path, const std::function<void(int fd)>& produce) {
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code error;
  fs::create_directories(folder, error);
  LF_CHECK(!error, RuntimeError, "Cannot create the folder ", folder.string(), " for ", path.string(), ": ",
           error.message(), ".");
  LF_CHECK(!fs::is_directory(path), RuntimeError, "Cannot write the file ", path.string(),
           ": it is a folder. Choose a file name.");
  const fs::path temporary = folder / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LF_CHECK(fd >= 0, RuntimeError, "Cannot write ", path.string(), ": creating ", temporary.string(), " failed: ",
           system_error_text(), ".");
  try {
    produce(fd);
    LF_CHECK(::fsync(fd) == 0, RuntimeError, "Flushing ", temporary.string(), " failed: ", system_error_text(), ".");
    LF_CHECK(::close(fd) == 0, RuntimeError, "Closing ", temporary.string(), " failed: ", system_error_text(), ".");
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = system_error_text();
    ::unlink(temporary.c_str());
    throw RuntimeError("Cannot move the finished " + temporary.string() + " to " + path.string() + ": " + reason + ".");
  }
  sync_folder(folder);
}

void write_file_atomically(const fs::path& path, const std::function<void(const ByteSink&)>& produce) {
  write_file_atomically_fd(path, [&](int fd) {
    produce([&](const void* data, size_t size) {
      size_t written = 0;
      while (written < size) {
        const ssize_t count = ::write(fd, static_cast<const char*>(data) + written, size - written);
        if (count < 0 && errno == EINTR) continue;
        LF_CHECK(count > 0, RuntimeError, "Writing ", path.string(), " failed: ", system_error_text(), ".");
        written += static_cast<size_t>(count);
      }
    });
  });
}

void write_file_atomically(const fs::path& path, std::string_view bytes) {
  write_file_atomically(path, [&](const ByteSink& sink) { sink(bytes.data(), bytes.size()); });
}

// Moves a finished folder to `path`, replacing what was there. Where the file system can swap two
// names atomically (Linux's RENAME_EXCHANGE), there is no moment without a checkpoint at `path`;
// otherwise the old folder is moved aside first and back if the second rename fails. The old
// content is deleted only once the new folder is in place.
void replace_folder(const fs::path& staging, const fs::path& path, const std::string& first_to_remove) {
  if (fs::exists(path) && ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0) {
    // staging now holds the previous folder: first_to_remove goes first, so that a kill during the
    // removal leaves nothing that looks complete.
    std::error_code ignored;
    if (!first_to_remove.empty()) fs::remove(staging / first_to_remove, ignored);
    fs::remove_all(staging, ignored);
    return;
  }
  const fs::path previous = path.string() + ".old-" + std::to_string(::getpid());
  const bool had_previous = fs::exists(path);
  if (had_previous) fs::rename(path, previous);
  try {
    fs::rename(staging, path);
  } catch (const fs::filesystem_error&) {
    if (had_previous) fs::rename(previous, path);
    throw;
  }
  std::error_code ignored;
  fs::remove_all(previous, ignored);
}

}  // namespace lightning::fabric
