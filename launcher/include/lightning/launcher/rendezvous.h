// The rendezvous of lightning-run nodes over a c10d TCPStore hosted by node 0's launcher. A job of
// fixed --num-nodes registers once (node rank claims, num-nodes agreement, local worker counts ->
// rank offsets) and restarts behind a barrier; an elastic job (--num-nodes MIN:MAX) forms a group
// in rounds, one per start of the workers (form_group). Both: failure propagation between nodes,
// lost-node heartbeats, the exit barrier. Workers join the same store
// (TORCHELASTIC_USE_AGENT_STORE) under the prefix /worker/attempt_<N>, N = the attempt (LT_ATTEMPT).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
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

/// A node that a worker's error names (Rendezvous::nodes_named_in).
struct NamedNode {
  int node_rank = 0;
  std::string description;  // "10.0.0.2 (node 1, host1)"
};

/// What a node tells the others when one of its workers failed.
struct RemoteFailure {
  int node_rank = 0;
  int global_rank = 0;   // -1: the node itself was lost (or, with regroup, none), not one of its ranks
  int exit_code = 1;     // the shell code the job ends with
  std::string summary;   // "exit code 3" / "signal SIGSEGV (11)"
  bool regroup = false;  // elastic: not a failure; nodes wait to join, so the group re-forms
  std::vector<int> suspects = {};  // node ranks the failed worker's error names (their machine may be down)
};

/// Where a failure that names other nodes began (Rendezvous::trace_suspects).
struct SuspectTrace {
  std::vector<int> lost;    // nodes that said nothing of a failure, or that blame each other: their
                            // machine or the network to them may be down
  std::vector<int> failed;  // nodes whose own worker failed without naming another node
  bool followed = false;    // the trace ends elsewhere than at the named nodes' machines
};

/// How an elastic job's attempt ended, for the next round (form_group).
struct AttemptEnd {
  bool counts_as_restart = true;  // a failure (or lost node); false: a regroup for waiting nodes
  std::vector<int> suspects = {};  // node ranks the failure names: node 0 waits for them briefly
};

class Rendezvous {
 public:
  /// Node 0 hosts the store (on loopback only when every node is this host), the others join it.
  /// Blocks until every node registered or the timeout passed.
  static Rendezvous establish(const LaunchArgs& args, int local_world_size);

  const NodeLayout& layout() const { return layout_; }
  int port() const { return layout_.main_port; }
  /// --num-nodes MIN:MAX: the group forms in rounds (form_group) and may change between attempts.
  bool elastic() const { return range_.has_value(); }

  /// Elastic, every node, before each attempt (collective over the nodes that take part): joins
  /// the next round and blocks until it forms, then layout() holds this node's place in the new
  /// group, layout().attempt and layout().restart_count. after: how the previous attempt ended
  /// (nullopt: the first round). Node 0 forms the round once at least MIN nodes are in: at once
  /// with MAX, or when every node expected back (the previous group less the lost nodes, plus the
  /// nodes that waited) is in, or --rdzv-last-call after MIN. A node left out of a full round
  /// waits for the next one. Throws RendezvousError after --rdzv-timeout.
  /// note: receives what a person should know meanwhile (this node waits for a place). poll: called
  /// about every 50 ms while a node other than 0 waits (it may throw, e.g. on a signal). A node
  /// waiting for a place when node 0 ends the job gets RendezvousError with exit code 0.
  void form_group(std::optional<AttemptEnd> after, const std::function<void(const std::string&)>& note,
                  const std::function<void()>& poll);
  /// Elastic, node 0, when the job ends (success or not): tells nodes waiting for a place.
  void close_rounds();
  /// Elastic, node 0, at each poll (not collective; looks about once a second): the host names of
  /// the nodes that arrived after the group formed, while it has room for them (empty: none).
  std::vector<std::string> nodes_waiting();

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
  /// Publishes which nodes the error of this node's failed worker names in `attempt` (empty: none,
  /// it failed on its own), so that nodes whose workers then lose this node's can trace the
  /// failure here and beyond (trace_suspects). Not collective; call it before tracing.
  void publish_suspects(int attempt, const std::vector<int>& suspects);
  /// Follows named nodes to where a failure began: a named node that published suspects of its own
  /// lost them first, so the trace goes on to them. A killed node's peers fail within
  /// milliseconds of each other, each naming the peer it talked to, which may be a live node that
  /// only stopped its workers. Waits up to `limit` in all for the named nodes' records; a node with
  /// none by then (its machine died) ends its chain as lost. Not collective. Throws RendezvousError
  /// if the store cannot be reached.
  SuspectTrace trace_suspects(int attempt, const std::vector<int>& named, std::chrono::milliseconds limit);
  /// "node 2 (host2)": the name the node announced, its --local-addr or else its host name.
  std::string describe_node(int node_rank) const;
  /// The names the nodes announced, by node rank.
  const std::vector<std::string>& node_names() const { return hosts_; }
  /// The other nodes whose address text mentions (a worker's error from gloo names the peer it
  /// lost by address), each as "10.0.0.2 (node 1, host1)"; empty when none.
  std::vector<NamedNode> nodes_named_in(const std::string& text) const;
  /// --in-memory-replicas on several nodes, every node before `attempt`'s workers start: publishes
  /// where this node's memory server listens for the other nodes (`port` on its first announced
  /// address; 127.0.0.1 when the rendezvous is on loopback) and returns every node's "host:port",
  /// by node rank, once all published (RendezvousError after --rdzv-timeout).
  std::vector<std::string> exchange_memory_endpoints(int attempt, int port);
  /// Barrier of all nodes before attempt `attempt` starts (restarts run in step).
  void wait_for_attempt(int attempt);
  /// `lightning-run status` (status.h): the number of the newest request, 0 while none was made.
  /// Not collective; one store call.
  int64_t status_requests();
  /// Answers status request `request` with this node's part; node 0 also writes how many nodes
  /// the group has, which the asking command waits for.
  void answer_status(int64_t request, const std::string& text);
  /// This node's workers all succeeded in `attempt`.
  void announce_done(int attempt);
  /// True once every node announced done for `attempt`.
  bool all_done(int attempt);

 private:
  Rendezvous() = default;
  /// The store at --main-address:--main-port, hosted here when host. nullptr: an elastic node on
  /// loopback found the port taken by another node of the job, so it joins instead.
  std::shared_ptr<c10d::TCPStore> connect(const LaunchArgs& args, bool host);
  void register_node(const LaunchArgs& args, int local_world_size);
  /// Both kinds: claims the agreement on --num-nodes (as written) and publishes this node's name
  /// (--local-addr, else its host name), addresses and local world size under its node id.
  void publish_node(const LaunchArgs& args, int local_world_size);
  /// The members' host names, addresses and local world sizes -> hosts_, addresses_, layout_.
  void load_members(int node_rank);
  /// form_group's halves: node 0 collects the arrivals of a round and writes the group; every
  /// other node arrives and reads it (false: left out, it waits for the next round).
  struct Heartbeat {
    int64_t count = -1;
    std::chrono::steady_clock::time_point changed;
  };
  /// expected: the nodes node 0 waits for (their heartbeats as last seen); one silent for
  /// --node-timeout is dropped, a suspect (named by the failure) after kSuspectSilence. regrouping: a round after the first, which forms as soon as every
  /// expected node is in (and at least MIN).
  void host_round(int round, int attempt, int restart_count, std::map<int, Heartbeat> expected, const std::set<int>& suspects,
                  bool regrouping);
  /// Nodes other than 0: adds to this node's heartbeat when a second has passed since the last.
  void beat();
  /// Node 0 in host_round, about once a second: drops the expected nodes, not yet arrived, whose
  /// heartbeat has not moved for --node-timeout.
  void forget_silent(std::map<int, Heartbeat>& expected, const std::set<int>& suspects, const std::vector<int>& arrived);
  bool join_round(int round, const std::function<void()>& poll);
  /// Whether node 0 ended the job (close_rounds).
  bool job_closed();
  int current_round();
  /// Node 0: the ids of the nodes that arrived in round_ and are not members (they wait).
  std::vector<std::string> waiting_ids();
  std::string key(const std::string& suffix) const;
  [[noreturn]] void lost_contact(const std::exception& error) const;
  /// Runs op on the store. On nodes other than 0 it runs on a thread of its own and is given up
  /// after --node-timeout: a TCPStore call to a host whose network is down blocks for many
  /// minutes. After one gives up, every later call throws at once (the connection is left to the
  /// blocked thread). Node 0 hosts the store in this process and calls it directly.
  template <typename Op>
  auto bounded(Op op) -> decltype(op(std::declval<c10d::TCPStore&>()));

  std::shared_ptr<c10d::TCPStore> store_;
  bool hosts_store_ = false;   // node 0: the store is served in this process
  std::optional<LaunchArgs::NodeRange> range_;  // elastic: --num-nodes MIN:MAX
  std::chrono::milliseconds last_call_{0};      // elastic: --rdzv-last-call
  int node_id_ = 0;            // fixed: the node rank; elastic: 0 for node 0, else given at first contact
  std::vector<int> members_;   // node ids by node rank (fixed: 0 .. num_nodes - 1)
  int round_ = -1;             // elastic: the round the members come from
  std::set<int> lost_ids_;     // node 0: members its watch found lost in the current attempt
  std::chrono::steady_clock::time_point last_waiting_check_;  // node 0: nodes_waiting's last look
  std::set<int> failure_seen_;  // attempts whose failure this node has counted as seen
  NodeLayout layout_;
  std::chrono::milliseconds timeout_{0};
  std::chrono::milliseconds node_timeout_{0};
  bool unreachable_ = false;                    // a bounded call gave up
  std::vector<std::string> hosts_;              // each node's announced name (--local-addr, else host name)
  std::vector<std::vector<std::string>> addresses_;  // each node's non-loopback IP addresses
  std::vector<Heartbeat> heartbeats_;           // node 0: what it last saw of each node (by node rank)
  int watched_attempt_ = -1;                    // node 0: the attempt heartbeats_ belong to
  std::chrono::steady_clock::time_point last_beat_;  // other nodes: when they last beat
};

/// family AF_INET or AF_INET6: a socket bound to the wildcard address in this process is bound
/// to that family's loopback address instead (c10d's TCPStore has no bind-address option; see
/// src/loopback_bind.cpp). AF_UNSPEC turns it off. The rendezvous enables it around the store of
/// a job whose nodes are all on this host.
void set_loopback_only_binding(int family);

}  // namespace lightning::launcher
