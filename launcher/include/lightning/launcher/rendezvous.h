// The static rendezvous of lightning-run nodes over a c10d TCPStore hosted by node 0's launcher:
// registration (node rank claims, num-nodes agreement, local worker counts -> rank offsets),
// failure propagation between nodes, restart and exit barriers. Workers join the same store
// (TORCHELASTIC_USE_AGENT_STORE) under the prefix /worker/attempt_<N>.
#pragma once

#include <chrono>
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

/// What a node tells the others when one of its workers failed.
struct RemoteFailure {
  int node_rank = 0;
  int global_rank = 0;
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

  std::shared_ptr<c10d::TCPStore> store_;
  std::set<int> failure_seen_;  // attempts whose failure this node has counted as seen
  NodeLayout layout_;
  std::chrono::milliseconds timeout_{0};
};

/// family AF_INET or AF_INET6: a socket bound to the wildcard address in this process is bound
/// to that family's loopback address instead (c10d's TCPStore has no bind-address option; see
/// src/loopback_bind.cpp). AF_UNSPEC turns it off. The rendezvous enables it around the store of
/// a job whose nodes are all on this host.
void set_loopback_only_binding(int family);

}  // namespace lightning::launcher
