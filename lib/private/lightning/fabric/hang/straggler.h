// Which rank holds a job back: from every rank's flight recorder, each rank's arrival lag at the
// collectives all ranks completed (its entry time minus the first rank's), over a sliding window.
// A rank that arrives last at most of them, by more than a threshold, is the straggler. Judged by
// lightning-run on one node (HangWatch::straggler, entry times on the node's monotonic clock) and
// otherwise by rank 0's hang watchdog from the entries every rank publishes in the store (entry
// times counted back from each collective's leave, which needs no synchronised clocks).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lightning::fabric {

struct StragglerSettings {
  double threshold_s = 0.05;  // median lag that counts as behind (lightning-run --straggler-threshold; 0: off)
  double share = 0.8;         // of the window's collectives at which the rank must arrive last
  size_t window = 32;         // the last collectives every rank completed
};

struct StragglerVerdict {
  int rank = -1;
  double share = 0;         // of the window's collectives this rank arrived last at
  double median_lag_s = 0;  // its median lag behind the first rank to arrive
  size_t collectives = 0;   // the window's size
};

/// One rank's entries: its global rank and (seq, enter_ns) of its last completed collectives.
struct RankEntries {
  int rank = -1;
  std::vector<std::pair<uint64_t, int64_t>> entries;
};

/// The straggler, if one rank arrives last at `share` of the last `window` collectives that every
/// rank completed, with a median lag of at least threshold_s; nullopt otherwise (also with fewer
/// than two ranks, fewer than window common collectives, or a threshold of 0).
std::optional<StragglerVerdict> find_straggler(const std::vector<RankEntries>& ranks, const StragglerSettings& settings);

/// The store's text form of entries, joined by commas: "seq:ns", or for the collective just before
/// the previous entry's (seq one less) only its ns minus the previous entry's ns (a third of the
/// bytes: at 16,384 ranks these entries are most of what the hang watch moves). parse_entries
/// reads it back exactly (a malformed entry ends the list there).
std::string serialize_entries(const std::vector<std::pair<uint64_t, int64_t>>& entries);
std::vector<std::pair<uint64_t, int64_t>> parse_entries(const std::string& text);

/// "rank 3 on host-b arrives last at 92% of the last 32 collectives, median 180 ms behind the first
/// (straggler threshold 0.05 s)".
std::string describe_straggler(const StragglerVerdict& verdict, const std::string& host, double threshold_s);

}  // namespace lightning::fabric
