#include "lightning/fabric/checkpoint/checkpoint_storage.h"

#include "lightning/fabric/errors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>

namespace lightning::fabric::checkpoint_storage {

namespace fs = std::filesystem;

namespace {
constexpr const char* kMetadata = ".metadata";

fs::path fresh_temporary(const std::string& purpose) {
  std::random_device entropy;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const fs::path candidate = fs::temp_directory_path() / ("lightning-fabric-" + purpose + "-" + std::to_string(::getpid()) +
                                                            "-" + std::to_string(entropy()));
    std::error_code error;
    if (fs::create_directory(candidate, error)) return candidate;
  }
  throw RuntimeError("cannot make a temporary folder for " + purpose + " in " + fs::temp_directory_path().string() +
                     "; set TMPDIR to a writable folder");
}

// The object `url`'s bytes, read from a local file mapped whole, in one PUT.
void put_file(const storage::S3Client& client, const storage::S3Url& url, const fs::path& file, const std::string& who) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  LF_CHECK(fd >= 0, RuntimeError, who, ": cannot read ", file.string(), " to upload it to ", url.str(), ": ", std::strerror(errno));
  struct stat info {};
  ::fstat(fd, &info);
  const size_t size = static_cast<size_t>(info.st_size);
  void* mapping = size ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  ::close(fd);
  LF_CHECK(size == 0 || mapping != MAP_FAILED, RuntimeError, who, ": cannot map ", file.string(), ": ", std::strerror(errno));
  try {
    client.put(url, std::string_view(static_cast<const char*>(mapping), size));
  } catch (...) {
    if (size) ::munmap(mapping, size);
    throw;
  }
  if (size) ::munmap(mapping, size);
}
}  // namespace

bool is_remote(const fs::path& path) { return storage::S3Url::is_s3(path.string()); }

LocalCopy::LocalCopy(LocalCopy&& other) noexcept
    : path_(std::move(other.path_)), temporary_(std::move(other.temporary_)), origin_(std::move(other.origin_)) {
  other.temporary_.clear();
}

std::string LocalCopy::named(const std::string& message) const {
  if (temporary_.empty()) return message;
  std::string out = message;
  const std::string local = path_.string();
  for (size_t at = out.find(local); at != std::string::npos; at = out.find(local, at + origin_.size()))
    out.replace(at, local.size(), origin_);
  return out;
}

LocalCopy::~LocalCopy() {
  std::error_code ignored;
  if (!temporary_.empty()) fs::remove_all(temporary_, ignored);
}

LocalCopy fetch(const fs::path& path, const std::string& who) {
  storage::S3Url::refuse_other_schemes(path.string(), who);
  if (!is_remote(path)) return LocalCopy(path, {}, path.string());
  const auto url = storage::S3Url::parse(path.string(), who);
  const auto client = storage::S3Client::from_environment(who);
  const fs::path temporary = fresh_temporary("checkpoint");
  try {
    const auto objects = client.list_folder(url);
    if (objects.count(kMetadata)) {  // a sharded folder: every object under the prefix
      const fs::path folder = temporary / "checkpoint";
      fs::create_directories(folder);
      for (const auto& [name, size] : objects) {
        if (name.find('/') != std::string::npos) continue;  // not part of this folder
        client.get_to_file(url.child(name), folder / name);
      }
      return LocalCopy(folder, temporary, path.string());
    }
    LF_CHECK(!url.key.empty(), RuntimeError, who, ": ", path.string(), " names a bucket, and no checkpoint folder is there");
    LF_CHECK(objects.empty(), RuntimeError, who, ": ", path.string(), " holds ", objects.size(), " objects (",
             objects.begin()->first, ", ...) but no .metadata: a sharded save there did not finish, or it is not a "
             "checkpoint. Load an earlier checkpoint");
    const fs::path file = temporary / fs::path(url.key).filename();
    client.get_to_file(url, file);  // RuntimeError naming the object when it is missing
    return LocalCopy(file, temporary, path.string());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(temporary, ignored);
    throw;
  }
}

TemporaryFolder::TemporaryFolder(const std::string& purpose) : path_(fresh_temporary(purpose)) {}
TemporaryFolder::~TemporaryFolder() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

RemoteFolder::RemoteFolder(const fs::path& url, const std::string& who)
    : url_(storage::S3Url::parse(url.string(), who)), client_(storage::S3Client::from_environment(who)), who_(who) {
  LF_CHECK(!url_.key.empty(), ValueError, who, ": ", url.string(), " names a bucket; a sharded checkpoint needs a prefix "
           "of its own, e.g. s3://", url_.bucket, "/checkpoints/step-100");
}

std::string RemoteFolder::part_suffix() const {
  if (!client_.list_folder(url_).count(kMetadata)) return "";
  std::random_device entropy;
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "-%06x%06x", entropy() & 0xffffff, entropy() & 0xffffff);
  return suffix;
}

void RemoteFolder::upload(const fs::path& file) const { put_file(client_, url_.child(file.filename().string()), file, who_); }

void RemoteFolder::commit(const fs::path& meta_file, const fs::path& metadata_file, const std::set<std::string>& written) const {
  const auto earlier = client_.list_folder(url_);
  if (earlier.count(kMetadata)) client_.remove(url_.child(kMetadata));  // no mix of two saves ever loads
  if (!meta_file.empty()) upload(meta_file);
  upload(metadata_file);  // the commit: from now on the folder is a checkpoint
  for (const auto& [name, size] : earlier) {
    if (name.find('/') != std::string::npos || written.count(name) || name == kMetadata ||
        name == meta_file.filename().string())
      continue;
    try {
      client_.remove(url_.child(name));
    } catch (const std::exception&) {  // past the commit, nothing may fail the save: the next save here removes it
    }
  }
}

void upload_file(const fs::path& file, const fs::path& url, const std::string& who) {
  put_file(storage::S3Client::from_environment(who), storage::S3Url::parse(url.string(), who), file, who);
}

bool is_remote_folder(const fs::path& url, const std::string& who) {
  const auto parsed = storage::S3Url::parse(url.string(), who);
  return storage::S3Client::from_environment(who).list_folder(parsed).count(kMetadata) > 0;
}

bool remote_exists(const fs::path& url, const std::string& who) {
  const auto parsed = storage::S3Url::parse(url.string(), who);
  for (const auto& object : storage::S3Client::from_environment(who).list(parsed))
    if (object.key == parsed.key) return true;
  return is_remote_folder(url, who);
}

}  // namespace lightning::fabric::checkpoint_storage
