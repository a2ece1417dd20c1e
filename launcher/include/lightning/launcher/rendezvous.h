// The static rendezvous of lightning-run nodes over a c10d TCPStore hosted by node 0's launcher:
// registration (node rank claims, num-nodes agreement, local worker counts -> rank offsets),
// failure propagation between nodes, restart and exit barriers. Workers join the same store
// (TORCHELASTIC_USE_AGENT_STORE) under the prefix /worker/attempt_<N>.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "lightning/launcher/worker_env.h"

namespace c10d {
class TCPStore;
}

namespace lightning::launcher {

/// A rendezvous failure with the exit code the launcher should leave with (2: configuration,
/// 1: the other side did not answer).
class RendezvousError : public std::runtime_error {
 public:
  RendezvousError(const std::string& message, int exit_code) : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

/// A node that stopped answering (watch_nodes).
struct LostNode {
  int node_rank = 0;
  std::string host;     // its host name, as it registered
  double silent_s = 0;  // how long it has not been heard from
};

/// What a node tells the others when one of its workers failed.
struct RemoteFailure {
  int node_rank = 0;
  int global_rank = 0;   // -1: the node itself was lost, not one of its ranks
  int exit_code = 1;     // the shell code the job ends with
  std::string summary;   // "exit code 3" / "signal SIGSEGV (11)"
};

class Rendezvous {
 public:
  /// Node 0 hosts the store (on loopback only when every node is this host), the others join it.
  /// Blocks until every node registered or the timeout passed.
  static Rendezvous establish(const LaunchArgs& args, int local_world_size);

  const NodeLayout& layout() const { return layout_; }
  int port() const { return layout_.main_port; }

  /// Announces this node's failure in `attempt` (the first announcement wins for the report).
  void announce_failure(int attempt, const RemoteFailure& failure);
  /// The failure some node announced in `attempt`, if any. Throws RendezvousError if the store
  /// cannot be reached.
  std::optional<RemoteFailure> failure(int attempt);
  /// Node 0, before it closes the store after a failure: waits up to `limit` until every node has
  /// seen the failure (announced it or read it), so that the others report it with its exit code
  /// instead of losing contact.
  void wait_until_failure_seen(int attempt, std::chrono::milliseconds limit);
  /// Each node calls it at every poll of an attempt (not collective; cheap). Nodes other than 0
  /// add to their heartbeat about once a second. Node 0 returns the nodes whose heartbeat has not
  /// moved for --node-timeout and that have not finished `attempt` (empty: none): their machine
  /// died or their network is down. (The other nodes notice a lost node 0 because no store call
  /// may take longer than --node-timeout.)
  std::vector<LostNode> watch_nodes(int attempt);
  /// "10.0.0.2 (node 1, host1)" for each address of another node that text mentions (a worker's
  /// error from gloo names the peer it lost by address), comma-separated; empty when none.
  std::string nodes_named_in(const std::string& text) const;
  /// Barrier of all nodes before attempt `attempt` starts (restarts run in step).
  void wait_for_attempt(int attempt);
  /// This node's workers all succeeded in `attempt`.
  void announce_done(int attempt);
  /// True once every node announced done for `attempt`.
  bool all_done(int attempt);

 private:
  Rendezvous() = default;
  void register_node(const LaunchArgs& args, int local_world_size);
  std::string key(const std::string& suffix) const;
  [[noreturn]] void lost_contact(const std::exception& error) const;
  /// Runs op on the store. On nodes other than 0 it runs on a thread of its own and is given up
  /// after --node-timeout: a TCPStore call to a host whose network is down blocks for many
  /// minutes. After one gives up, every later call throws at once (the connection is left to the
  /// blocked thread). Node 0 hosts the store in this process and calls it directly.
  template <typename Op>
  auto bounded(Op op) -> decltype(op(std::declval<c10d::TCPStore&>()));

  struct Heartbeat {
    int64_t count = -1;
    std::chrono::steady_clock::time_point changed;
  };

  std::shared_ptr<c10d::TCPStore> store_;
  std::set<int> failure_seen_;  // attempts whose failure this node has counted as seen
  NodeLayout layout_;
  std::chrono::milliseconds timeout_{0};
  std::chrono::milliseconds node_timeout_{0};
  bool unreachable_ = false;                    // a bounded call gave up
  std::vector<std::string> hosts_;              // each node's host name
  std::vector<std::vector<std::string>> addresses_;  // each node's non-loopback IP addresses
  std::vector<Heartbeat> heartbeats_;           // node 0: what it last saw of each node
  int watched_attempt_ = -1;                    // node 0: the attempt heartbeats_ belong to
  std::chrono::steady_clock::time_point last_beat_;  // other nodes: when they last beat
};

/// family AF_INET or AF_INET6: a socket bound to the wildcard address in this process is bound
/// to that family's loopback address instead (c10d's TCPStore has no bind-address option; see
/// src/loopback_bind.cpp). AF_UNSPEC turns it off. The rendezvous enables it around the store of
/// a job whose nodes are all on this host.
void set_loopback_only_binding(int family);

}  // namespace lightning::launcher
