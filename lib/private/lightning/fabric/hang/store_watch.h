// The store side of hang detection in store mode (hang_watchdog.h): what every rank publishes
// once a period and what rank 0 reads back. Requests are batched so that the store's load stays
// flat per rank: a rank's period costs two requests (one multiSet, one check), and rank 0 reads
// every rank with two more (one check, one multiGet), however many ranks there are. Used by the
// watchdog thread and by the store-scale benchmark, which runs thousands of simulated ranks on it.
// Not thread-safe: one StoreWatch per thread. Keys live under the store it is given (the
// watchdog's is <attempt prefix>/lightning_fabric/watch).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}

namespace lightning::fabric::internal {

/// How often each rank publishes (and rank 0 reads): a quarter of the hang timeout, at least
/// 100 ms, and at most the longest of 1 s, 24 ms per store client (every rank, or one store relay
/// per node) and 0.5 ms per rank (rank 0 reads every rank each period). Without relays, with the
/// default 300 s timeout, the store serves about 85 hang-watch requests a second up to 3125 ranks
/// (24.6 s at 1024); beyond, the period stays at 75 s and the load grows (109 a second at 4096
/// ranks). With a relay per node of 128 ranks: 1 s up to 2000 ranks, 8.2 s at 16,384.
std::chrono::milliseconds store_watch_period(int world_size, int store_clients, std::chrono::milliseconds hang_timeout);

/// Every how many periods rank 0 reads every rank's straggler entries (which the ranks publish
/// every period): 1 up to 2048 ranks, then world_size / 2048 (8 at 16,384), so that this read,
/// most of the watch's cost to the store, costs what it costs at 2048 ranks. Progress, which a
/// hang is judged from, is read every period.
int store_watch_entries_every(int world_size);

struct PublishedProgress {
  std::string progress;  // flight::Progress::serialize()
  std::string entries;   // serialize_entries(), empty when stragglers are not watched
};

class StoreWatch {
 public:
  StoreWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size);

  /// This rank's period: publishes its progress (and its entries when watch_entries), then says
  /// whether rank 0 asked every rank to dump (the folder it named; nullopt: no request).
  std::optional<std::string> publish(const std::string& progress, const std::string& entries, bool watch_entries);
  /// Rank 0: what every rank published, in rank order; nullopt for a rank that has not yet.
  std::vector<std::optional<PublishedProgress>> read_all(bool watch_entries);
  /// Rank 0: asks every rank to dump into dir.
  void request_dump(const std::string& dir);
  /// A rank: it has written its dump.
  void mark_dumped();
  /// Rank 0: whether rank has written its dump.
  bool dumped(int rank);

 private:
  std::string key(const std::string& what, int rank) const;

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_ = 0;
  int world_size_ = 1;
  std::vector<std::string> all_keys_;  // progress/0..N-1, then entries/0..N-1
  bool all_progress_published_ = false;  // every rank's progress key exists
  bool all_entries_published_ = false;   // ... and every rank's entries key
};

}  // namespace lightning::fabric::internal
