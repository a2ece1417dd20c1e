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
  CHECK(lf::describe_straggler(*verdict, "host-b", 0.05) ==
        "rank 3 on host-b arrives last at 100% of the last 32 collectives, median 150 ms behind the first "
        "(straggler threshold 0.05 s)");
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

TEST_CASE("entry times counted back from the leave name the straggler without a shared clock", "[straggler]") {
  // Three ranks on unrelated clocks (offsets of hours). Every collective ends at one moment;
  // rank 1 waits 1 ms in each, ranks 0 and 2 wait 121 and 123 ms.
  const int64_t offsets[] = {0, 7'200'000'000'000, -3'600'000'000'000};
  std::vector<lf::RankEntries> ranks;
  for (int rank = 0; rank < 3; ++rank) {
    lf::RankEntries one{rank, {}};
    for (uint64_t seq = 40; seq >= 1; --seq) {
      const int64_t leave = static_cast<int64_t>(seq) * 300'000'000 + offsets[rank];
      const int64_t wait = rank == 1 ? 1'000'000 : 121'000'000 + rank * 1'000'000;
      one.entries.emplace_back(seq, (leave - wait) - leave);  // what EntryTimes::kFromLeave gives
    }
    ranks.push_back(one);
  }
  const auto verdict = lf::find_straggler(ranks, lf::StragglerSettings());
  REQUIRE(verdict);
  CHECK(verdict->rank == 1);
  CHECK(verdict->median_lag_s == Approx(0.122));  // behind rank 2, which waits longest (123 ms)
}

TEST_CASE("entries survive the store's text form, and a malformed tail is dropped", "[straggler]") {
  const std::vector<std::pair<uint64_t, int64_t>> entries{{12, -1500}, {11, 0}, {10, 987654321012}};
  CHECK(lf::serialize_entries(entries) == "12:-1500,1500,987654321012");
  CHECK(lf::parse_entries(lf::serialize_entries(entries)) == entries);
  const std::vector<std::pair<uint64_t, int64_t>> gap{{9, 1}, {7, 2}, {6, 5}, {0, 3}};  // not consecutive: absolute
  CHECK(lf::serialize_entries(gap) == "9:1,7:2,3,0:3");
  CHECK(lf::parse_entries(lf::serialize_entries(gap)) == gap);
  CHECK(lf::parse_entries("").empty());
  CHECK(lf::parse_entries("0:4,1") == std::vector<std::pair<uint64_t, int64_t>>{{0, 4}});  // no seq before 0
  CHECK(lf::parse_entries("2:1,3:5x,1:1") == std::vector<std::pair<uint64_t, int64_t>>{{2, 1}});
  CHECK(lf::parse_entries("-1:5").empty());
  CHECK(lf::parse_entries("3:5,oops,2:1") == std::vector<std::pair<uint64_t, int64_t>>{{3, 5}});
}
