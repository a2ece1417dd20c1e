// The store relay: a node's lightning-run holds the one connection of its node to the job's main
// TCPStore, and its workers talk to it over a local socket instead of each connecting to the main
// store. Requests that arrive together are sent upstream together: sets as one multiSet, adds on
// one key as one add (each caller gets the value it would have seen in some serial order), checks
// as one check, and waits for keys by one check of every waited key. A worker started without a
// relay (torchrun, srun, mpirun) connects to the main store as before.
//
// Both ends live here: StoreRelay (the agent's side) and connect_store_relay (a worker's
// c10d::Store). The socket is a Linux abstract socket named by the address string: it needs no
// file, disappears with its process, and is private to the network namespace (the node).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace lightning::fabric::internal {

/// What a relay has done so far (for benchmarks and tests).
struct StoreRelayCounts {
  int64_t client_requests = 0;    // requests its workers sent
  int64_t upstream_requests = 0;  // requests it sent to the main store
};

class StoreRelay {
 public:
  /// Connects to the main store at host:port (upstream_timeout: its connection and any one
  /// request) and starts serving `address` (an abstract socket name; empty: one is made up from
  /// the pid and a counter). Throws RuntimeError naming the store when it cannot connect.
  StoreRelay(const std::string& host, int port, std::chrono::milliseconds upstream_timeout, std::string address = "");
  /// Same, over a store this process already holds (lightning-run's node 0 hosts the main store).
  explicit StoreRelay(c10::intrusive_ptr<c10d::Store> upstream, std::string address = "");
  /// Stops serving: workers still connected get an error on their next request. Waits at most
  /// 200 ms: a relay blocked on a silent main store (a cut link) ends when its call times out.
  ~StoreRelay();
  StoreRelay(const StoreRelay&) = delete;
  StoreRelay& operator=(const StoreRelay&) = delete;

  /// The address workers pass to connect_store_relay (LT_STORE_RELAY).
  const std::string& address() const;
  StoreRelayCounts counts() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with its thread
};

/// A worker's store through its node's relay at `address`; `timeout` bounds its get and wait
/// calls (c10d's Store timeout) and the connection. Throws RuntimeError when no relay answers.
c10::intrusive_ptr<c10d::Store> connect_store_relay(const std::string& address, std::chrono::milliseconds timeout);

}  // namespace lightning::fabric::internal
