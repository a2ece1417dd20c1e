// The hang watch's store protocol (StoreWatch) over a real TCPStore on 127.0.0.1: what ranks
// publish reaches rank 0, with the entries when stragglers are watched; a dump request reaches
// every rank; a rank that has not published is absent; the period stretches with the job.
#include <catch2/catch.hpp>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "lightning/fabric/hang/store_watch.h"

namespace internal = lightning::fabric::internal;
using std::chrono::milliseconds;

namespace {
c10::intrusive_ptr<c10d::Store> fresh_store() {
  c10d::TCPStoreOptions options;
  options.isServer = true;
  options.waitWorkers = false;
  options.port = 0;
  return c10::make_intrusive<c10d::PrefixStore>("watch", c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options));
}
}  // namespace

TEST_CASE("store watch: rank 0 reads what every rank published, and who has not yet", "[hang][store_watch]") {
  auto store = fresh_store();
  internal::StoreWatch rank0(store, 0, 3), rank1(store, 1, 3), rank2(store, 2, 3);
  CHECK_FALSE(rank0.publish("p0", "e0", true));
  CHECK_FALSE(rank1.publish("p1", "e1", true));
  auto partial = rank0.read_all(true);
  REQUIRE(partial.size() == 3);
  CHECK(partial[0]->progress == "p0");
  CHECK(partial[1]->progress == "p1");
  CHECK_FALSE(partial[2].has_value());  // rank 2 has not published yet

  CHECK_FALSE(rank2.publish("p2", "e2", true));
  auto all = rank0.read_all(true);
  for (int rank = 0; rank < 3; ++rank) {
    REQUIRE(all[rank].has_value());
    CHECK(all[rank]->progress == "p" + std::to_string(rank));
    CHECK(all[rank]->entries == "e" + std::to_string(rank));
  }
  CHECK_FALSE(rank1.publish("p1 later", "e1 later", true));
  CHECK(rank0.read_all(true)[1]->progress == "p1 later");
}

TEST_CASE("store watch: without stragglers only progress is published and read", "[hang][store_watch]") {
  auto store = fresh_store();
  internal::StoreWatch rank0(store, 0, 2), rank1(store, 1, 2);
  rank0.publish("p0", "", false);
  rank1.publish("p1", "", false);
  auto all = rank0.read_all(false);
  CHECK(all[1]->progress == "p1");
  CHECK(all[1]->entries.empty());
  CHECK_FALSE(store->check({"entries/1"}));
}

TEST_CASE("store watch: a dump request reaches every rank, and rank 0 sees who dumped", "[hang][store_watch]") {
  auto store = fresh_store();
  internal::StoreWatch rank0(store, 0, 2), rank1(store, 1, 2);
  CHECK_FALSE(rank1.publish("p1", "", false));
  rank0.request_dump("/tmp/dumps");
  const auto asked = rank1.publish("p1", "", false);
  REQUIRE(asked.has_value());
  CHECK(*asked == "/tmp/dumps");
  CHECK_FALSE(rank0.dumped(1));
  rank1.mark_dumped();
  CHECK(rank0.dumped(1));
}

TEST_CASE("store watch: the period is a quarter of the hang timeout, stretched with the job", "[hang][store_watch]") {
  const auto minutes5 = std::chrono::seconds(300);
  CHECK(internal::store_watch_period(2, 2, minutes5) == milliseconds(1000));
  CHECK(internal::store_watch_period(41, 41, minutes5) == milliseconds(1000));
  CHECK(internal::store_watch_period(1024, 1024, minutes5) == milliseconds(24 * 1024));
  CHECK(internal::store_watch_period(4096, 4096, minutes5) == milliseconds(75000));  // a quarter of the timeout at most
  CHECK(internal::store_watch_period(8, 8, std::chrono::seconds(2)) == milliseconds(500));
  CHECK(internal::store_watch_period(8, 8, milliseconds(100)) == milliseconds(100));  // never under 100 ms
  // Store relays: one client per node; rank 0 still reads every rank.
  CHECK(internal::store_watch_period(2000, 16, minutes5) == milliseconds(1000));
  CHECK(internal::store_watch_period(4096, 32, minutes5) == milliseconds(2048));
  CHECK(internal::store_watch_period(16384, 128, minutes5) == milliseconds(8192));
  CHECK(internal::store_watch_entries_every(2) == 1);
  CHECK(internal::store_watch_entries_every(2048) == 1);
  CHECK(internal::store_watch_entries_every(2049) == 2);
  CHECK(internal::store_watch_entries_every(16384) == 8);
}
