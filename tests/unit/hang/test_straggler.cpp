// find_straggler (hang/straggler.h) on synthetic recorder entries: a planted slow rank is named, a
// balanced job and a rank that is only sometimes late are not.
#include "lightning/fabric/hang/straggler.h"

// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

namespace {
// `ranks` ranks entering collectives 1..count, 10 ms apart; lag_ns(rank, seq) delays a rank.
template <class Lag>
std::vector<lf::RankEntries> entries(int ranks, uint64_t count, Lag lag_ns) {
  std::vector<lf::RankEntries> result;
  for (int rank = 0; rank < ranks; ++rank) {
    lf::RankEntries one{rank, {}};
    for (uint64_t seq = count; seq >= 1; --seq) {
      one.entries.emplace_back(seq, static_cast<int64_t>(seq) * 10'000'000 + lag_ns(rank, seq));
    }
    result.push_back(one);
  }
  return result;
}
}  // namespace

TEST_CASE("a rank that arrives last at most collectives by more than the threshold is named", "[straggler]") {
  const lf::StragglerSettings settings;  // 50 ms, 80 %, 32 collectives
  const auto planted = entries(4, 40, [](int rank, uint64_t) { return rank == 3 ? 150'000'000 : rank * 1'000'000; });
  const auto verdict = lf::find_straggler(planted, settings);
  REQUIRE(verdict);
  CHECK(verdict->rank == 3);
  CHECK(verdict->share == 1.0);
  CHECK(verdict->median_lag_s == Approx(0.150));
  CHECK(verdict->collectives == 32);
  CHECK_THAT(lf::describe_straggler(*verdict, "host-b"),
             Contains("rank 3 on host-b arrives last at 100% of the last 32 collectives, median 150 ms behind the first"));
}

TEST_CASE("a balanced job, a sometimes-late rank and a short history name no one", "[straggler]") {
  const lf::StragglerSettings settings;
  // Everyone within a few ms: the last rank changes, and the lag is under the threshold anyway.
  CHECK_FALSE(lf::find_straggler(entries(4, 40, [](int rank, uint64_t seq) { return ((rank + seq) % 4) * 2'000'000; }),
                                 settings));
  // Late by 150 ms, but only at every other collective: last at 50 %, under the 80 % share.
  CHECK_FALSE(lf::find_straggler(entries(2, 40, [](int rank, uint64_t seq) {
                                   return rank == 1 && seq % 2 == 0 ? 150'000'000 : (rank == 0 ? 1'000'000 : 0);
                                 }),
                                 settings));
  // Always last, but 10 ms behind: under the threshold.
  CHECK_FALSE(lf::find_straggler(entries(2, 40, [](int rank, uint64_t) { return rank * 10'000'000; }), settings));
  // Fewer common collectives than the window, a single rank, the threshold 0 (off).
  const auto slow = [](int rank, uint64_t) { return rank * 200'000'000; };
  CHECK_FALSE(lf::find_straggler(entries(2, 20, slow), settings));
  CHECK_FALSE(lf::find_straggler(entries(1, 40, slow), settings));
  lf::StragglerSettings off;
  off.threshold_s = 0;
  CHECK_FALSE(lf::find_straggler(entries(2, 40, slow), off));
}

TEST_CASE("only collectives every rank completed count", "[straggler]") {
  const auto slow = [](int rank, uint64_t) { return rank * 100'000'000; };
  auto ranks = entries(2, 50, slow);
  ranks[0].entries.erase(ranks[0].entries.begin(), ranks[0].entries.begin() + 10);  // rank 0 has 1..40 only
  const auto verdict = lf::find_straggler(ranks, lf::StragglerSettings{});
  REQUIRE(verdict);
  CHECK(verdict->rank == 1);
  CHECK(verdict->collectives == 32);
  auto short_history = entries(2, 40, slow);
  short_history[0].entries.erase(short_history[0].entries.begin(), short_history[0].entries.begin() + 20);
  CHECK_FALSE(lf::find_straggler(short_history, lf::StragglerSettings{}));  // 20 in common
}
