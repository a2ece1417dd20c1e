// The node's cache of an s3:// dataset's chunk files: one local folder that every process of the
// node reading the same dataset shares, bounded by a byte budget.
//
// Contract:
// - A chunk is downloaded once while the budget keeps it: one process downloads it (an exclusive
//   flock on NAME.fetch), the others wait for that lock and then find the file.
// - A process that reads a chunk holds it (a shared flock on NAME.use). A held chunk is never
//   evicted. A chunk fetched ahead of its reader is not held: it is the most recently used.
// - Chunks on disk plus those being downloaded (each reserved as NAME.reserve, whose length is the
//   chunk's size) never exceed the budget. To make room, unheld chunks are evicted (unlinked),
//   least recently held first: a chunk is evicted once read, when room is needed.
// - A process killed mid-download leaves a reservation whose NAME.fetch lock is free; the next
//   process that reserves removes it and its partial file.
// All locks are flocks, so a process that dies releases them.
#pragma once

#include "lightning/fabric/storage/s3_client.h"

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

namespace lightning::fabric::data_detail {

class ChunkCache {
 public:
  /// A chunk's presence on disk, kept while the Hold lives.
  class Hold {
   public:
    explicit Hold(int fd) : fd_(fd) {}
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    int fd_;
  };

  /// `who` prefixes errors (the dataset's name). `budget` in bytes.
  ChunkCache(std::filesystem::path dir, storage::S3Client client, storage::S3Url remote, int64_t budget, std::string who);

  /// Holds chunk `name` (`bytes` long on the server) for a reader, downloading it first when
  /// absent. When the budget has no room, evicts unheld chunks; if none can go, calls
  /// `release_idle` (the caller's own idle holds) and waits for other holders, up to kRoomWait
  /// seconds, then a RuntimeError naming the budget, the chunk and what holds the room.
  std::shared_ptr<Hold> hold(const std::string& name, int64_t bytes, const std::function<void()>& release_idle = {});
  /// Downloads chunk `name` ahead of its reader, without holding it (a fetched-ahead chunk is the
  /// most recently used, so evicted last). Never waits: true when the chunk is on disk or another
  /// process is downloading it, false when the budget has no room now.
  bool fetch_ahead(const std::string& name, int64_t bytes);

  const std::filesystem::path& dir() const { return dir_; }
  int64_t budget() const { return budget_; }
  /// The most bytes on disk (chunks and reservations of every process of the node) this process
  /// saw right after it reserved room: at most the budget.
  int64_t peak_bytes() const { return peak_.load(); }
  /// Chunks this process downloaded.
  int64_t downloads() const { return downloads_.load(); }

  static constexpr double kRoomWait = 120;

 private:
  // Reserves `bytes` for `name` under the folder's budget lock; false when there is no room.
  bool reserve(const std::string& name, int64_t bytes, int64_t* used_out);
  // Downloads `name` into place, its reservation made (the fetch lock held).
  void download(const std::string& name);

  std::filesystem::path dir_;
  storage::S3Client client_;
  storage::S3Url remote_;
  int64_t budget_;
  std::string who_;
  std::atomic<int64_t> peak_{0}, downloads_{0};
};

}  // namespace lightning::fabric::data_detail
