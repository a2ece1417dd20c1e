#include "lightning/fabric/storage/object_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/storage/node_memory.h"
#include "lightning/fabric/storage/s3_client.h"

namespace lightning::fabric::storage {

namespace {
constexpr std::string_view kMemoryScheme = "memory://";

bool is_memory(std::string_view text) { return text.rfind(kMemoryScheme, 0) == 0; }

// One bucket of an S3-compatible store.
class S3Bucket final : public ObjectStore {
 public:
  S3Bucket(S3Client client, std::string bucket, std::string who)
      : client_(std::move(client)), bucket_(std::move(bucket)), who_(std::move(who)) {}
  std::string get(const std::string& key) const override { return client_.get(at(key)); }
  int64_t get_to_file(const std::string& key, const std::filesystem::path& path) const override {
    return client_.get_to_file(at(key), path);
  }
  void put(const std::string& key, std::string_view bytes) const override { client_.put(at(key), bytes); }
  // The file mapped whole, in one PUT.
  void put_file(const std::string& key, const std::filesystem::path& file) const override {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    LF_CHECK(fd >= 0, RuntimeError, who_, ": cannot read ", file.string(), " to upload it to ", url(key), ": ",
             std::strerror(errno));
    struct stat info {};
    ::fstat(fd, &info);
    const size_t size = static_cast<size_t>(info.st_size);
    void* mapping = size ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
    ::close(fd);
    LF_CHECK(size == 0 || mapping != MAP_FAILED, RuntimeError, who_, ": cannot map ", file.string(), ": ", std::strerror(errno));
    try {
      client_.put(at(key), std::string_view(static_cast<const char*>(mapping), size));
    } catch (...) {
      if (size) ::munmap(mapping, size);
      throw;
    }
    if (size) ::munmap(mapping, size);
  }
  std::map<std::string, int64_t> list_folder(const std::string& folder) const override {
    return client_.list_folder(at(folder));
  }
  bool exists(const std::string& key) const override {
    for (const auto& object : client_.list(at(key)))
      if (object.key == key) return true;
    return false;
  }
  void remove(const std::string& key) const override { client_.remove(at(key)); }
  std::string url(const std::string& key) const override { return at(key).str(); }

 private:
  S3Url at(const std::string& key) const { return S3Url{bucket_, key}; }
  S3Client client_;
  std::string bucket_;
  std::string who_;
};
}  // namespace

bool is_object_url(std::string_view text) { return S3Url::is_s3(text) || is_memory(text); }

void refuse_unknown_schemes(std::string_view text, const std::string& who) {
  if (is_memory(text)) return;
  try {
    S3Url::refuse_other_schemes(text, who);
  } catch (const ValueError& error) {
    throw ValueError(std::string(error.what()) + "; inside a job started with lightning-run --in-memory-replicas, also "
                     "memory://key (the node's memory)");
  }
}

ObjectAddress object_address(std::string_view text, const std::string& who) {
  if (is_memory(text)) {
    std::string key(text.substr(kMemoryScheme.size()));
    while (!key.empty() && key.back() == '/') key.pop_back();
    return {NodeMemoryClient::from_environment(who), key};
  }
  const S3Url url = S3Url::parse(text, who);
  return {std::make_shared<const S3Bucket>(S3Client::from_environment(who), url.bucket, who), url.key};
}

}  // namespace lightning::fabric::storage
