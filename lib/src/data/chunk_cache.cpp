#include "lightning/fabric/data/chunk_cache.h"

#include "lightning/fabric/errors.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <tuple>
#include <vector>

namespace lightning::fabric::data_detail {

namespace fs = std::filesystem;

namespace {

// An open lock file, closed (and so unlocked) with the object.
class LockFile {
 public:
  LockFile(const fs::path& path, const std::string& who) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    LF_CHECK(fd_ >= 0, RuntimeError, who, ": cannot open the cache's lock file ", path.string(), ": ", std::strerror(errno),
             "; the cache folder must be writable (set LT_STREAMING_CACHE_DIR or the dataset's cache_dir)");
  }
  ~LockFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;
  /// Blocks until locked (`operation`: LOCK_SH or LOCK_EX); with LOCK_NB, whether it got the lock.
  bool lock(int operation) {
    while (::flock(fd_, operation) != 0) {
      if (errno == EWOULDBLOCK) return false;
      LF_CHECK(errno == EINTR, RuntimeError, "flock failed: ", std::strerror(errno));
    }
    return true;
  }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

bool ends_with(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

// Files of the folder that are not chunks or reservations: locks, partial downloads, the index.
bool bookkeeping(const std::string& name) {
  return ends_with(name, ".use") || ends_with(name, ".fetch") || name.find(".part-") != std::string::npos ||
         name == "index.json" || name == ".budget";
}

void remove_partials(const fs::path& dir, const std::string& name) {
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(dir, ignored)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(name + ".part-", 0) == 0) fs::remove(entry.path(), ignored);
  }
}

}  // namespace

ChunkCache::Hold::~Hold() {
  if (fd_ >= 0) ::close(fd_);
}

ChunkCache::ChunkCache(fs::path dir, storage::S3Client client, storage::S3Url remote, int64_t budget, std::string who)
    : dir_(std::move(dir)), client_(std::move(client)), remote_(std::move(remote)), budget_(budget), who_(std::move(who)) {}

bool ChunkCache::reserve(const std::string& name, int64_t bytes, int64_t* used_out) {
  LockFile budget_lock(dir_ / ".budget", who_);
  budget_lock.lock(LOCK_EX);
  int64_t used = 0;
  std::vector<std::tuple<fs::file_time_type, std::string, int64_t>> chunks;  // evictable: (last held, name, size)
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir_, error)) {
    const std::string file = entry.path().filename().string();
    std::error_code ignored;
    if (bookkeeping(file) || !entry.is_regular_file(ignored)) continue;
    const auto size = static_cast<int64_t>(entry.file_size(ignored));
    if (ends_with(file, ".reserve")) {
      const std::string chunk = file.substr(0, file.size() - 8);
      LockFile fetch(dir_ / (chunk + ".fetch"), who_);
      if (chunk != name && fetch.lock(LOCK_EX | LOCK_NB)) {  // its downloader died: not a reservation
        fs::remove(entry.path(), ignored);
        remove_partials(dir_, chunk);
        continue;
      }
      used += size;
      continue;
    }
    used += size;
    chunks.emplace_back(entry.last_write_time(ignored), file, size);
  }
  LF_CHECK(!error, RuntimeError, who_, ": cannot list the cache folder ", dir_.string(), ": ", error.message());
  std::sort(chunks.begin(), chunks.end());
  // The unheld chunks, least recently used first, locked (so no reader takes them meanwhile) until
  // enough room is found; evicted only when the reservation then fits, else none is.
  std::vector<std::pair<std::unique_ptr<LockFile>, std::pair<std::string, int64_t>>> evictable;
  int64_t freed = 0;
  for (const auto& [when, chunk, size] : chunks) {
    if (used - freed + bytes <= budget_) break;
    auto use = std::make_unique<LockFile>(dir_ / (chunk + ".use"), who_);
    if (!use->lock(LOCK_EX | LOCK_NB)) continue;  // a reader of this node holds it
    freed += size;
    evictable.emplace_back(std::move(use), std::make_pair(chunk, size));
  }
  *used_out = used;
  if (used - freed + bytes > budget_) return false;
  for (const auto& [lock, chunk] : evictable) {
    std::error_code ignored;
    fs::remove(dir_ / chunk.first, ignored);
    used -= chunk.second;
  }
  *used_out = used;
  const fs::path reservation = dir_ / (name + ".reserve");
  const int fd = ::open(reservation.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const bool sized = fd >= 0 && ::ftruncate(fd, bytes) == 0;
  const int saved_errno = errno;
  if (fd >= 0) ::close(fd);
  LF_CHECK(sized, RuntimeError, who_, ": cannot write ", reservation.string(), ": ", std::strerror(saved_errno));
  int64_t peak = peak_.load();
  while (used + bytes > peak && !peak_.compare_exchange_weak(peak, used + bytes)) {
  }
  return true;
}

void ChunkCache::download(const std::string& name) {
  std::error_code ignored;
  try {
    client_.get_to_file(remote_.child(name), dir_ / name);
  } catch (...) {
    fs::remove(dir_ / (name + ".reserve"), ignored);
    throw;
  }
  fs::remove(dir_ / (name + ".reserve"), ignored);
  ++downloads_;
}

namespace {
// Makes chunk `path` the most recently used (evicted last).
void touch(const fs::path& path) { ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0); }
// Removes what a downloader of `name` that died left (the caller holds name's fetch lock).
void clear_dead_download(const fs::path& dir, const std::string& name) {
  std::error_code ignored;
  fs::remove(dir / (name + ".reserve"), ignored);
  remove_partials(dir, name);
}
}  // namespace

std::shared_ptr<ChunkCache::Hold> ChunkCache::hold(const std::string& name, int64_t bytes,
                                                   const std::function<void()>& release_idle) {
  const fs::path path = dir_ / name;
  LockFile use(dir_ / (name + ".use"), who_);
  use.lock(LOCK_SH);  // before looking: an evictor holds the exclusive lock while it removes the file
  auto held = std::make_shared<Hold>(use.release());
  if (fs::exists(path)) return touch(path), held;
  LockFile fetch(dir_ / (name + ".fetch"), who_);
  fetch.lock(LOCK_EX);  // one downloader per chunk on the node; the others wait here, then find the file
  if (fs::exists(path)) return touch(path), held;
  clear_dead_download(dir_, name);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t used = 0; !reserve(name, bytes, &used);) {
    if (release_idle) release_idle();  // every time: the caller's other threads may have opened more
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    LF_CHECK(waited < kRoomWait, RuntimeError, who_, ": the cache budget has no room for chunk ", name, " (", bytes,
             " bytes) after ", static_cast<int>(kRoomWait), " s: ", used, " of its ", budget_, " bytes (max_cache_bytes, in ",
             dir_.string(), ") hold chunks the node's readers are reading. Raise max_cache_bytes to hold, per process "
             "of the node, the chunks its reading threads read at once, or lower threads");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  download(name);
  return held;
}

bool ChunkCache::fetch_ahead(const std::string& name, int64_t bytes) {
  const fs::path path = dir_ / name;
  LockFile use(dir_ / (name + ".use"), who_);
  use.lock(LOCK_SH);  // kept from eviction while this looks
  if (fs::exists(path)) return touch(path), true;
  LockFile fetch(dir_ / (name + ".fetch"), who_);
  if (!fetch.lock(LOCK_EX | LOCK_NB)) return true;  // another process or thread downloads it
  if (fs::exists(path)) return touch(path), true;
  clear_dead_download(dir_, name);
  int64_t used = 0;
  if (!reserve(name, bytes, &used)) return false;
  download(name);
  return true;
}

}  // namespace lightning::fabric::data_detail
