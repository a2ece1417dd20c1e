// Where a checkpoint's objects live when it is not a local path: S3-compatible storage (s3://bucket/key)
// or the memory of the job's node agents (memory://key: lightning-run --in-memory-replicas,
// node_memory.h). The checkpoint code writes local files and carries them through this one interface
// (checkpoint_storage.h); both stores have the same contract: a put replaces the object whole, a
// get reads what one put wrote, never a mix. Nothing here uses LibTorch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace lightning::fabric::storage {

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  /// The whole object. RuntimeError naming it when it is missing or cannot be read.
  virtual std::string get(const std::string& key) const = 0;
  /// The object written to `path` (never a torn file there); returns its size.
  virtual int64_t get_to_file(const std::string& key, const std::filesystem::path& path) const = 0;
  /// Writes the object, replacing one of that key.
  virtual void put(const std::string& key, std::string_view bytes) const = 0;
  /// Writes the local file `file` as the object.
  virtual void put_file(const std::string& key, const std::filesystem::path& file) const = 0;
  /// The objects under the folder `folder` (keys starting with folder + "/"; every object for an
  /// empty folder), by name relative to it, with their sizes.
  virtual std::map<std::string, int64_t> list_folder(const std::string& folder) const = 0;
  /// Whether an object of exactly this key exists.
  virtual bool exists(const std::string& key) const = 0;
  virtual void remove(const std::string& key) const = 0;
  /// The URL that names `key` in messages (s3://bucket/key, memory://key).
  virtual std::string url(const std::string& key) const = 0;
  /// Whether local staging for this store belongs in memory (/dev/shm) rather than on disk.
  virtual bool stages_in_memory() const { return false; }
  /// A descriptor to read the object from in place (the caller closes it), for stores whose objects
  /// are local memory files; -1 where objects must be copied (get_to_file).
  virtual int open_object(const std::string& key) const { (void)key; return -1; }
};

/// An object, or a folder of them, in a store.
struct ObjectAddress {
  std::shared_ptr<const ObjectStore> store;
  std::string key;
  std::string url() const { return store->url(key); }
  /// The folder's object `name` (key + "/" + name, or name for an empty key).
  ObjectAddress child(const std::string& name) const { return {store, key.empty() ? name : key + "/" + name}; }
};

/// Whether `text` names an object store: s3:// or memory://.
bool is_object_url(std::string_view text);
/// ValueError naming `who`, the text and the choices when text starts with a URL scheme other than
/// s3:// and memory:// (gs://, http://, ...), which would otherwise be taken for a local path.
void refuse_unknown_schemes(std::string_view text, const std::string& who);
/// The store and key `text` names, its client set up from the environment (S3: s3_client.h;
/// memory: LT_NODE_MEMORY, set by lightning-run --in-memory-replicas). ValueError naming `who`.
ObjectAddress object_address(std::string_view text, const std::string& who);

}  // namespace lightning::fabric::storage
