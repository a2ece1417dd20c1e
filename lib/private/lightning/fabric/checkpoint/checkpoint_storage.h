// Where a checkpoint lives: a local (or shared) path, or an object store (s3://bucket/key, or
// memory://key: the node agents' memory, storage/object_store.h). The checkpoint code writes and
// reads local files; this layer carries them to and from the store (docs/checkpoints.md, "Object
// storage"):
// - one file: written with one PUT (the object appears whole or not at all), read with one GET;
// - a sharded folder (torch.distributed.checkpoint's layout): every rank uploads its own part
//   file; rank 0 uploads meta.pt, then .metadata last (the commit: a folder without .metadata is
//   not a checkpoint), then removes the objects of an earlier save there. A save over an earlier
//   one names its parts apart (__R_0-TOKEN.distcp), so the earlier stays whole while they upload;
//   the commit removes the earlier .metadata before it uploads meta.pt, so a save killed or failed
//   during its commit leaves no checkpoint there, never a mix of the two. A failed save's parts
//   stay (a folder without .metadata never loads); the next save there removes them.
// Nothing here uses LibTorch: `lightning-run model consolidate` links it.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/storage/object_store.h"

namespace lightning::fabric::checkpoint_storage {

/// Whether `path` names an object store (s3:// or memory://).
bool is_remote(const std::filesystem::path& path);

/// A local copy of a checkpoint to read: for a local path, the path itself; for an object store, the
/// object (one file) or every object under the prefix (a folder holding .metadata) downloaded into
/// a fresh temporary folder, removed with the LocalCopy; for memory://, no bytes are copied: the
/// folder holds links to the objects' memory files, which the LocalCopy keeps open.
class LocalCopy {
 public:
  LocalCopy(const LocalCopy&) = delete;
  LocalCopy& operator=(const LocalCopy&) = delete;
  LocalCopy(LocalCopy&& other) noexcept;
  ~LocalCopy();
  const std::filesystem::path& path() const { return path_; }
  /// `message` (an error of reading the copy) naming the checkpoint's URL instead of the copy.
  std::string named(const std::string& message) const;

 private:
  friend LocalCopy fetch(const std::filesystem::path& path, const std::string& who);
  LocalCopy(std::filesystem::path path, std::filesystem::path temporary, std::string origin, std::vector<int> open = {})
      : path_(std::move(path)), temporary_(std::move(temporary)), origin_(std::move(origin)), open_(std::move(open)) {}
  std::filesystem::path path_;
  std::filesystem::path temporary_;  // empty: nothing to remove
  std::string origin_;               // the URL the copy came from
  std::vector<int> open_;            // memory files the links in temporary_ name (/proc/self/fd/N)
};

/// Reads the checkpoint at `path` through `read(local path)` on a local copy (see fetch); an error
/// it raises names `path`, not the copy.
template <class Read>
auto read_checkpoint(const std::filesystem::path& path, const std::string& who, const Read& read);

/// A local copy of the checkpoint at `path` (see LocalCopy). RuntimeError naming the URL when
/// neither an object nor a checkpoint folder is there (`who` prefixes errors).
LocalCopy fetch(const std::filesystem::path& path, const std::string& who);

/// A fresh temporary local folder (for staging what goes to the store), removed with the object;
/// in /dev/shm when `in_memory` (and /dev/shm is writable), else in TMPDIR.
class TemporaryFolder {
 public:
  explicit TemporaryFolder(const std::string& purpose, bool in_memory = false);
  ~TemporaryFolder();
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// A sharded folder written to an object store (see above). Every rank uploads its parts with upload();
/// rank 0 calls begin() before any rank uploads and commit() after every rank's parts are up.
class RemoteFolder {
 public:
  RemoteFolder(const std::filesystem::path& url, const std::string& who);
  /// Whether staging for this folder belongs in memory (memory://).
  bool stages_in_memory() const { return folder_.store->stages_in_memory(); }
  /// Rank 0, before the parts: "" for a new folder; over an earlier save, a fresh suffix
  /// ("-" and 12 hex digits) for this save's part names.
  std::string part_suffix() const;
  /// Uploads local file `file` as the folder's object of the same name.
  void upload(const std::filesystem::path& file) const;
  /// Rank 0, last: removes an earlier save's .metadata, uploads meta_file (if any), then
  /// metadata_file, then removes every other object under the prefix that is not in `written`
  /// (the earlier save's parts; one that cannot be removed stays, and the next save there
  /// removes it). Throws only before metadata_file is up.
  void commit(const std::filesystem::path& meta_file, const std::filesystem::path& metadata_file,
              const std::set<std::string>& written) const;

 private:
  storage::ObjectAddress folder_;
  std::string who_;
};

template <class Read>
auto read_checkpoint(const std::filesystem::path& path, const std::string& who, const Read& read) {
  const LocalCopy copy = fetch(path, who);
  try {
    return read(copy.path());
  } catch (const ValueError& e) {
    throw ValueError(copy.named(e.what()));
  } catch (const RuntimeError& e) {
    throw RuntimeError(copy.named(e.what()));
  }
}

/// Uploads local file `file` to the object `url` (s3:// or memory://), in one put.
void upload_file(const std::filesystem::path& file, const std::filesystem::path& url, const std::string& who);
/// Whether an object or a checkpoint folder exists at the object store's `url`.
bool remote_exists(const std::filesystem::path& url, const std::string& who);
/// Whether a sharded checkpoint folder (a prefix holding .metadata) is at the object store's `url`.
bool is_remote_folder(const std::filesystem::path& url, const std::string& who);

}  // namespace lightning::fabric::checkpoint_storage
