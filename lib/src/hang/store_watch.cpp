#include "lightning/fabric/hang/store_watch.h"

#include <algorithm>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "lightning/fabric/internal/store_chunks.h"
#include "lightning/fabric/internal/store_text.h"

namespace lightning::fabric::internal {

std::chrono::milliseconds store_watch_period(int world_size, int store_clients, std::chrono::milliseconds hang_timeout) {
  const auto longest = std::max({std::chrono::milliseconds(1000), std::chrono::milliseconds(24) * store_clients,
                                 std::chrono::milliseconds(world_size / 2)});
  return std::clamp(hang_timeout / 4, std::chrono::milliseconds(100), longest);
}

int store_watch_entries_every(int world_size) { return std::max(1, (world_size + 2047) / 2048); }

StoreWatch::StoreWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size)
    : store_(std::move(store)), rank_(rank), world_size_(world_size) {}

std::string StoreWatch::key(const std::string& what, int rank) const { return what + "/" + std::to_string(rank); }

std::optional<std::string> StoreWatch::publish(const std::string& progress, const std::string& entries,
                                               bool watch_entries) {
  if (watch_entries) {
    store_->multiSet({key("progress", rank_), key("entries", rank_)}, {store_bytes(progress), store_bytes(entries)});
  } else {
    store_->set(key("progress", rank_), store_bytes(progress));
  }
  if (!store_->check({"dump"})) return std::nullopt;
  return store_text(store_->get("dump"));
}

std::vector<std::optional<PublishedProgress>> StoreWatch::read_all(bool watch_entries) {
  std::vector<std::optional<PublishedProgress>> all(static_cast<size_t>(world_size_));
  if (all_keys_.empty()) {  // rank 0 only: every other rank never reads
    for (const char* what : {"progress", "entries"}) {
      for (int peer = 0; peer < world_size_; ++peer) all_keys_.push_back(key(what, peer));
    }
  }
  const size_t count = static_cast<size_t>(world_size_) * (watch_entries ? 2 : 1);
  const std::vector<std::string> keys(all_keys_.begin(), all_keys_.begin() + static_cast<std::ptrdiff_t>(count));
  const auto read_together = [&](const std::vector<std::string>& names, bool with_entries) {
    const auto values = multi_get_in_chunks(*store_, names);
    for (size_t rank = 0; rank < all.size(); ++rank) {
      const std::string entries = with_entries ? store_text(values[all.size() + rank]) : "";
      all[rank] = PublishedProgress{store_text(values[rank]), entries};
    }
    return all;
  };
  // The steady state: one multiGet reads it all. Keys are never removed, so once every rank's are
  // there the check (a third of the store's work for this read) is not asked again.
  bool& known = watch_entries ? all_entries_published_ : all_progress_published_;
  if (known || check_in_chunks(*store_, keys)) {
    known = true;
    all_progress_published_ = true;
    return read_together(keys, watch_entries);
  }
  const std::vector<std::string> progress_keys(all_keys_.begin(), all_keys_.begin() + world_size_);
  if (watch_entries && (all_progress_published_ || check_in_chunks(*store_, progress_keys))) {  // entries not all there yet
    all_progress_published_ = true;
    return read_together(progress_keys, false);
  }
  for (int rank = 0; rank < world_size_; ++rank) {  // starting up: rank by rank, entries left out
    const std::string progress = key("progress", rank);
    if (store_->check({progress})) all[rank] = PublishedProgress{store_text(store_->get(progress)), ""};
  }
  return all;
}

void StoreWatch::request_dump(const std::string& dir) { store_->set("dump", store_bytes(dir)); }

void StoreWatch::mark_dumped() { store_->set(key("dumped", rank_), store_bytes("1")); }

bool StoreWatch::dumped(int rank) { return store_->check({key("dumped", rank)}); }

}  // namespace lightning::fabric::internal
