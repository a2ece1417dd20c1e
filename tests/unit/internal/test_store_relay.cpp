// The store relay (store_relay.h) over a real TCPStore on 127.0.0.1: every Store call answers as
// the main store would; concurrent adds each get a distinct running value and the main store sees
// fewer requests than the workers sent; a get waits for a later set; timeouts and a lost main store
// or relay are errors naming them; a gloo process group of 4 thread ranks forms through two relays
// (two "nodes") and all-reduces.
#include <ATen/ATen.h>
#include <future>
#include <set>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "lightning/fabric/internal/store_relay.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/plugins/collectives/collective_rendezvous.h"
#include "../thread_ranks.h"

#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
namespace internal = lightning::fabric::internal;
using std::chrono::milliseconds;

namespace {
c10::intrusive_ptr<c10d::TCPStore> main_store() {
  c10d::TCPStoreOptions options;
  options.isServer = true;
  options.waitWorkers = false;
  options.port = 0;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}
std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }
std::string text(const std::vector<uint8_t>& value) { return {value.begin(), value.end()}; }
}  // namespace

TEST_CASE("store relay: every Store call answers as the main store does", "[internal][store_relay]") {
  auto server = main_store();
  internal::StoreRelay relay("127.0.0.1", server->getPort(), std::chrono::seconds(10));
  auto store = internal::connect_store_relay(relay.address(), std::chrono::seconds(10));
  store->set("a", bytes("1"));
  CHECK(text(server->get("a")) == "1");
  server->set("b", bytes("2"));
  CHECK(text(store->get("b")) == "2");
  CHECK(store->add("n", 5) == 5);
  CHECK(store->add("n", -2) == 3);
  CHECK(store->check({"a", "b"}));
  CHECK_FALSE(store->check({"a", "missing"}));
  store->multiSet({"x", "y"}, {bytes("X"), bytes("")});
  const auto both = store->multiGet({"y", "x"});
  REQUIRE(both.size() == 2);
  CHECK(text(both[0]).empty());
  CHECK(text(both[1]) == "X");
  CHECK(text(store->compareSet("a", bytes("1"), bytes("one"))) == "one");
  CHECK(text(store->compareSet("a", bytes("1"), bytes("uno"))) == "one");
  store->append("a", bytes("+"));
  CHECK(text(server->get("a")) == "one+");
  CHECK(store->getNumKeys() == server->getNumKeys());
  CHECK(store->deleteKey("a"));
  CHECK_FALSE(store->deleteKey("a"));
  store->wait({"x", "y"});
  CHECK(store->hasExtendedApi());
  auto copy = store->clone();
  CHECK(text(copy->get("x")) == "X");
}

TEST_CASE("store relay: concurrent adds and sets are batched, each caller sees a serial order",
          "[internal][store_relay]") {
  auto server = main_store();
  internal::StoreRelay relay("127.0.0.1", server->getPort(), std::chrono::seconds(10));
  constexpr int kWorkers = 32, kRounds = 20;
  std::vector<std::set<int64_t>> seen(kWorkers);
  std::vector<std::future<void>> workers;
  for (int worker = 0; worker < kWorkers; ++worker) {
    workers.push_back(std::async(std::launch::async, [&, worker] {
      auto store = internal::connect_store_relay(relay.address(), std::chrono::seconds(10));
      for (int round = 0; round < kRounds; ++round) {
        seen[worker].insert(store->add("counter", 1));
        store->set("worker/" + std::to_string(worker), bytes(std::to_string(round)));
      }
    }));
  }
  for (auto& worker : workers) worker.get();
  std::set<int64_t> all;
  for (const auto& values : seen) all.insert(values.begin(), values.end());
  CHECK(all.size() == static_cast<size_t>(kWorkers * kRounds));  // every add got its own value
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == kWorkers * kRounds);
  CHECK(server->add("counter", 0) == kWorkers * kRounds);
  for (int worker = 0; worker < kWorkers; ++worker) CHECK(text(server->get("worker/" + std::to_string(worker))) == "19");
  const auto counts = relay.counts();
  CHECK(counts.client_requests == 2 * kWorkers * kRounds);
  CHECK(counts.upstream_requests <= counts.client_requests);
}

TEST_CASE("store relay: a get waits for a later set; timeouts and lost stores are errors", "[internal][store_relay]") {
  auto server = main_store();
  auto relay = std::make_unique<internal::StoreRelay>("127.0.0.1", server->getPort(), std::chrono::seconds(10));
  auto store = internal::connect_store_relay(relay->address(), std::chrono::seconds(10));
  auto later = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(milliseconds(100));
    server->set("late", bytes("here"));
  });
  CHECK(text(store->get("late")) == "here");
  later.get();
  auto waiters = std::async(std::launch::async, [&] {
    auto other = internal::connect_store_relay(relay->address(), std::chrono::seconds(10));
    return text(other->multiGet({"k1", "k2"})[1]);
  });
  std::this_thread::sleep_for(milliseconds(50));
  store->multiSet({"k1", "k2"}, {bytes("v1"), bytes("v2")});
  CHECK(waiters.get() == "v2");

  store->setTimeout(milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(store->get("never"), Catch::Contains("timeout") && Catch::Contains("never"));
  CHECK(std::chrono::steady_clock::now() - start >= milliseconds(200));
  CHECK_THROWS_WITH(store->wait({"never"}, milliseconds(50)), Catch::Contains("timeout"));

  relay.reset();  // the launcher is gone
  CHECK_THROWS_WITH(store->get("late"), Catch::Contains("closed the connection"));
  CHECK_THROWS_WITH(internal::connect_store_relay("no-such-relay", milliseconds(50)),
                    Catch::Contains("no-such-relay") && Catch::Contains("LT_STORE_RELAY"));
}

TEST_CASE("store relay: a lost main store fails every waiting worker with its reason", "[internal][store_relay]") {
  auto server = main_store();
  internal::StoreRelay relay("127.0.0.1", server->getPort(), std::chrono::seconds(2));
  auto store = internal::connect_store_relay(relay.address(), std::chrono::seconds(30));
  auto waiting = std::async(std::launch::async, [&] { return store->get("never"); });
  std::this_thread::sleep_for(milliseconds(100));
  server.reset();  // the main store's node is gone
  CHECK_THROWS_WITH(waiting.get(), Catch::Contains("main store failed"));
  CHECK_THROWS_WITH(store->add("x", 1), Catch::Contains("main store failed"));
}

TEST_CASE("store relay: 4 thread ranks on two relays form a gloo group and all-reduce", "[internal][store_relay]") {
  int port = 0;
  auto server = lf::host_store("127.0.0.1", 0, std::chrono::seconds(30), &port);
  internal::StoreRelay node0("127.0.0.1", port, std::chrono::seconds(30));
  internal::StoreRelay node1("127.0.0.1", port, std::chrono::seconds(30));
  lf_test::RankChecks checks;
  const auto run = [&](int rank) {
    try {
      auto options = lf_test::thread_rank_options(rank, 4, port);
      options.use_agent_store = true;
      options.store_relay = rank < 2 ? node0.address() : node1.address();
      options.local_world_size = 2;
      lf::Collective world(options);
      auto value = at::full({3}, static_cast<float>(rank + 1));
      world.all_reduce_(value, lf::ReduceOp::Sum);
      checks.expect(at::equal(value, at::full({3}, 10.0f)), "rank " + std::to_string(rank) + ": wrong sum");
    } catch (const std::exception& error) {
      checks.expect(false, "rank " + std::to_string(rank) + " threw: " + error.what());
    }
  };
  std::vector<std::future<void>> ranks;
  for (int rank = 0; rank < 4; ++rank) ranks.push_back(std::async(std::launch::async, run, rank));
  for (auto& rank : ranks) rank.get();
  for (const auto& failure : checks.failures()) FAIL_CHECK(failure);
}
