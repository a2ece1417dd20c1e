// Ranks as threads of one test process: each thread has its own gloo Collective over a TCPStore
// on 127.0.0.1 that rank 0 hosts. Catch2's assertions are not thread-safe, so rank bodies record
// failures through RankChecks and the calling thread reports them.
#pragma once

#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "lightning/fabric/plugins/collectives/collective.h"

namespace lf_test {

class RankChecks {
 public:
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    std::lock_guard<std::mutex> lock(mutex_);
    failures_.push_back(what);
  }
  std::vector<std::string> failures() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return failures_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> failures_;
};

inline lightning::fabric::CollectiveOptions thread_rank_options(int rank, int world_size, int port) {
  lightning::fabric::CollectiveOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.main_port = port;
  options.settings.flight_records = 0;  // one recorder per process; the ranks share this one
  options.settings.rendezvous_timeout = std::chrono::seconds(30);
  options.settings.timeout = std::chrono::seconds(30);
  return options;
}

/// Runs body(world, checks) on `count` ranks at once and returns every failure any rank recorded
/// (an exception escaping a body is one, with its message).
template <class Body>
std::vector<std::string> on_thread_ranks(int count, Body body) {
  namespace lf = lightning::fabric;
  RankChecks checks;
  int port = 0;
  auto store = lf::host_store("127.0.0.1", 0, std::chrono::seconds(30), &port);
  const auto run = [&](int rank) {
    try {
      lf::Collective world(thread_rank_options(rank, count, port), rank == 0 ? store : c10::intrusive_ptr<c10d::Store>());
      body(world, checks);
    } catch (const std::exception& error) {
      checks.expect(false, "rank " + std::to_string(rank) + " threw: " + error.what());
    }
  };
  std::vector<std::future<void>> others;
  for (int rank = 1; rank < count; ++rank) others.push_back(std::async(std::launch::async, run, rank));
  run(0);
  for (auto& other : others) other.get();
  return checks.failures();
}

}  // namespace lf_test
