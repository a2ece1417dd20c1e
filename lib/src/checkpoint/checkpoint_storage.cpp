#include "lightning/fabric/checkpoint/checkpoint_storage.h"

#include "lightning/fabric/errors.h"
#include "lightning/fabric/storage/node_memory.h"

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

fs::path fresh_temporary(const std::string& purpose, bool in_memory) {
  std::random_device entropy;
  std::error_code error;
  const std::string memory = storage::NodeMemoryClient::staging_base();  // a killed rank's leftovers are removed there
  const fs::path base = in_memory && ::access(memory.c_str(), W_OK) == 0 ? fs::path(memory) : fs::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    const fs::path candidate = base / ("lightning-fabric-" + purpose + "-" + std::to_string(::getpid()) + "-" +
                                       std::to_string(entropy()));
    if (fs::create_directory(candidate, error)) return candidate;
  }
  throw RuntimeError("cannot make a temporary folder for " + purpose + " in " + base.string() + ": " +
                     error.message() + (in_memory ? "" : "; set TMPDIR to a writable folder"));
}
}  // namespace

bool is_remote(const fs::path& path) { return storage::is_object_url(path.string()); }

LocalCopy::LocalCopy(LocalCopy&& other) noexcept
    : path_(std::move(other.path_)), temporary_(std::move(other.temporary_)), origin_(std::move(other.origin_)),
      open_(std::move(other.open_)) {
  other.temporary_.clear();
  other.open_.clear();
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
  for (int fd : open_) ::close(fd);
}

LocalCopy fetch(const fs::path& path, const std::string& who) {
  storage::refuse_unknown_schemes(path.string(), who);
  if (!is_remote(path)) return LocalCopy(path, {}, path.string());
  const storage::ObjectAddress url = storage::object_address(path.string(), who);
  const fs::path temporary = fresh_temporary("checkpoint", url.store->stages_in_memory());
  std::vector<int> open;  // memory files read in place, through links
  // The object `key` at `local`: a link to its memory file where the store has one, else a copy.
  auto bring = [&](const std::string& key, const fs::path& local) {
    const int fd = url.store->open_object(key);
    if (fd < 0) return (void)url.store->get_to_file(key, local);
    open.push_back(fd);
    fs::create_symlink("/proc/self/fd/" + std::to_string(fd), local);
  };
  try {
    const auto objects = url.store->list_folder(url.key);
    if (objects.count(kMetadata)) {  // a sharded folder: every object under the prefix
      const fs::path folder = temporary / "checkpoint";
      fs::create_directories(folder);
      for (const auto& [name, size] : objects) {
        if (name.find('/') != std::string::npos) continue;  // not part of this folder
        bring(url.child(name).key, folder / name);
      }
      return LocalCopy(folder, temporary, path.string(), std::move(open));
    }
    LF_CHECK(!url.key.empty(), RuntimeError, who, ": ", path.string(), " names a bucket or store, and no checkpoint folder is there");
    LF_CHECK(objects.empty(), RuntimeError, who, ": ", path.string(), " holds ", objects.size(), " objects (",
             objects.begin()->first, ", ...) but no .metadata: a sharded save there did not finish, or it is not a "
             "checkpoint. Load an earlier checkpoint");
    const fs::path file = temporary / fs::path(url.key).filename();
    bring(url.key, file);  // RuntimeError naming the object when it is missing
    return LocalCopy(file, temporary, path.string(), std::move(open));
  } catch (...) {
    for (int fd : open) ::close(fd);
    std::error_code ignored;
    fs::remove_all(temporary, ignored);
    throw;
  }
}

TemporaryFolder::TemporaryFolder(const std::string& purpose, bool in_memory) : path_(fresh_temporary(purpose, in_memory)) {}
TemporaryFolder::~TemporaryFolder() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

RemoteFolder::RemoteFolder(const fs::path& url, const std::string& who)
    : folder_(storage::object_address(url.string(), who)), who_(who) {
  LF_CHECK(!folder_.key.empty(), ValueError, who, ": ", url.string(), " names a bucket or store; a sharded checkpoint ",
           "needs a prefix of its own, e.g. ", folder_.child("checkpoints/step-100").url());
}

std::string RemoteFolder::part_suffix() const {
  if (!folder_.store->list_folder(folder_.key).count(kMetadata)) return "";
  std::random_device entropy;
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "-%06x%06x", entropy() & 0xffffff, entropy() & 0xffffff);
  return suffix;
}

void RemoteFolder::upload(const fs::path& file) const { folder_.store->put_file(folder_.child(file.filename().string()).key, file); }

void RemoteFolder::commit(const fs::path& meta_file, const fs::path& metadata_file, const std::set<std::string>& written) const {
  const auto earlier = folder_.store->list_folder(folder_.key);
  if (earlier.count(kMetadata)) folder_.store->remove(folder_.child(kMetadata).key);  // no mix of two saves ever loads
  if (!meta_file.empty()) upload(meta_file);
  upload(metadata_file);  // the commit: from now on the folder is a checkpoint
  for (const auto& [name, size] : earlier) {
    if (name.find('/') != std::string::npos || written.count(name) || name == kMetadata ||
        name == meta_file.filename().string())
      continue;
    try {
      folder_.store->remove(folder_.child(name).key);
    } catch (const std::exception&) {  // past the commit, nothing may fail the save: the next save here removes it
    }
  }
}

void upload_file(const fs::path& file, const fs::path& url, const std::string& who) {
  const storage::ObjectAddress object = storage::object_address(url.string(), who);
  object.store->put_file(object.key, file);
}

bool is_remote_folder(const fs::path& url, const std::string& who) {
  const storage::ObjectAddress folder = storage::object_address(url.string(), who);
  return folder.store->list_folder(folder.key).count(kMetadata) > 0;
}

bool remote_exists(const fs::path& url, const std::string& who) {
  const storage::ObjectAddress object = storage::object_address(url.string(), who);
  return object.store->exists(object.key) || object.store->list_folder(object.key).count(kMetadata) > 0;
}

}  // namespace lightning::fabric::checkpoint_storage
