#include "lightning/launcher/run.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/registry.h"
#include "lightning/fabric/utilities/env_vars.h"
#include "lightning/fabric/utilities/error_file.h"
#include "lightning/fabric/utilities/process.h"
#include "lightning/fabric/hang/hang_report.h"
#include "lightning/fabric/hang/hang_watch.h"
#include "lightning/fabric/internal/step_times.h"
#include "lightning/fabric/internal/store_relay.h"
#include "lightning/fabric/storage/node_memory.h"
#include "lightning/launcher/numa_binding.h"
#include "lightning/launcher/output.h"
#include "lightning/launcher/rendezvous.h"
#include "lightning/launcher/worker_env.h"

namespace lightning::launcher {
namespace {

using fabric::ChildProcess;
using fabric::ExitStatus;
using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

constexpr int kFinishTimeoutExitCode = 124;
// How long a node whose worker lost a peer waits for the records of the nodes it traces: the
// peers of a killed machine fail within a second of each other; a dead node never answers.
constexpr auto kBlameTraceLimit = std::chrono::seconds(3);
// `lightning-run status`: how often each node looks for a request, and how long it waits for its
// ranks' stacks before it answers without the missing ones.
constexpr auto kStatusPoll = std::chrono::milliseconds(250);
constexpr auto kStatusWait = std::chrono::seconds(3);

// Every signal lightning-run may read from its signalfd: those --signals-to-handle may name (SIGUSR1
// and SIGUSR2 among them), and SIGCHLD.
sigset_t all_launcher_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (const auto& entry : handleable_signals()) sigaddset(&set, entry.second);
  sigaddset(&set, SIGCHLD);
  return set;
}

// The signals this job reads: --signals-to-handle (they stop the job), SIGUSR1 and SIGUSR2 (when not
// listed: forwarded, the job goes on), SIGCHLD.
sigset_t launcher_signals(const LaunchArgs& args) {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : args.signals_to_handle) sigaddset(&set, sig);
  for (int sig : {SIGUSR1, SIGUSR2, SIGCHLD}) sigaddset(&set, sig);
  return set;
}

// A signal that is forwarded to the workers while the job goes on: SIGUSR1 or SIGUSR2 when
// --signals-to-handle does not list it.
bool forwarded_only(const LaunchArgs& args, int sig) {
  return (sig == SIGUSR1 || sig == SIGUSR2) &&
         std::find(args.signals_to_handle.begin(), args.signals_to_handle.end(), sig) == args.signals_to_handle.end();
}

void say(const std::string& message) { std::cerr << "lightning-run: " << message << std::endl; }

Millis seconds(double value) { return Millis(static_cast<int64_t>(value * 1000.0)); }

std::string shell_quote(const std::string& word) {
  if (!word.empty() && word.find_first_of(" \t\n'\"\\$`!*?;&|<>(){}[]#~") == std::string::npos) return word;
  std::string quoted = "'";
  for (char c : word) quoted += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// "node 1 (host1) stopped answering: ..." for the nodes node 0 found silent.
std::string lost_nodes_summary(const std::vector<LostNode>& lost, int num_nodes, double node_timeout_s) {
  const bool several = lost.size() > 1;
  std::string nodes;
  double silent_s = 0;
  for (const LostNode& node : lost) {
    silent_s = std::max(silent_s, node.silent_s);
    nodes += (nodes.empty() ? "" : ", ") + std::string("node ") + std::to_string(node.node_rank) + " (" + node.host + ")";
  }
  std::string summary = nodes + " stopped answering: no heartbeat from " + (several ? "their lightning-runs" : "its lightning-run") +
                        " for " + format_seconds(std::round(silent_s * 10) / 10) + "s (--node-timeout=" +
                        format_seconds(node_timeout_s) + "s); " +
                        (several ? "their machines died or the network to them is down" : "its machine died or its network is down");
  if (several && static_cast<int>(lost.size()) == num_nodes - 1) {
    summary += " (every other node went silent at once: this node's own network may be the one that is down)";
  }
  return summary;
}

// The first failure of an attempt: a local worker, another node, or the finish timeout.
struct Failure {
  int node_rank = 0;
  int global_rank = 0;
  int local_rank = -1;  // -1: on another node
  int exit_code = 1;
  std::string summary;
  std::string error_file;
  bool regroup = false;  // elastic: nodes wait to join; the group re-forms (not a failure)
  std::vector<int> suspects = {};  // node ranks this failure's error names
};

enum class Outcome { Success, Failed, Signalled };

class Job {
 public:
  explicit Job(const LaunchArgs& args) : args_(args) {}
  ~Job();
  int run();

 private:
  Outcome run_attempt(int attempt);
  /// The one failure path of an attempt: records failure, tells the other nodes when it happened
  /// here (local_rank >= 0 on a multi-node job), stops this node's workers.
  Outcome fail(int attempt, Failure failure);
  void spawn_all(int attempt);
  void stop_workers(int signal);
  void read_output_for(Millis slice);
  std::optional<Outcome> check_for_hang(int attempt);
  /// How each local worker ended ("" while it runs), for the recorders' readers.
  std::vector<std::string> exit_states() const;
  /// `lightning-run status` (status.h), at each poll: takes a new request (asks the local ranks
  /// for their stacks) or, once they answered or kStatusWait passed, publishes this node's text.
  void answer_status(int attempt);
  void report_straggler();
  void report_step_times(int attempt) const;
  int wait_for_other_nodes(int attempt);
  /// Multi-node, at each poll: a failure another node announced, or (node 0) a node that stopped
  /// answering, or (node 0 of an elastic job, while may_regroup) nodes waiting to join, which it
  /// announces to the others. Stops this node's workers before a lost contact with node 0
  /// (RendezvousError) leaves the job.
  std::optional<Failure> watch_other_nodes(int attempt, bool may_regroup);
  /// Whether the job spans nodes that must hear of each other (an elastic job always does: nodes
  /// may join).
  bool multi_node() const { return layout_.num_nodes > 1 || rendezvous_->elastic(); }
  /// Whether this launcher judges hangs (worker_env.h: launcher_judges_hangs).
  bool judges_hangs() const { return launcher_judges_hangs(layout_.num_nodes); }
  /// After a failed attempt of an elastic job: forms the next group and returns true, or returns
  /// false when the failure ends the job (no restarts left).
  bool regroup_after(int attempt);
  void say_layout() const;
  /// While no worker runs (an elastic round forming): a stopping signal leaves the job at once
  /// (RendezvousError with 128 + signal).
  void stop_on_signal();
  /// Tells the other nodes about a failure here; stops this node's workers before a lost contact
  /// with node 0 leaves the job.
  void announce_or_stop(int attempt, const RemoteFailure& failure);
  /// Runs op (rendezvous store calls). When node 0 is out of reach (RendezvousError) it stops this
  /// node's workers first, since no worker may outlive this launcher, and rethrows.
  template <typename Op>
  auto or_stop(Op op) -> decltype(op()) {
    try {
      return op();
    } catch (const RendezvousError&) {
      stop_workers(SIGTERM);
      throw;
    }
  }
  /// Multi-node, a local worker failed: publishes the nodes its error names and traces them to
  /// where the failure began (up to kBlameTraceLimit), sets failure_.suspects to the nodes that
  /// may be down, and returns what the summary gains ("" when the error names no node).
  std::string trace_blame(int attempt, const std::vector<NamedNode>& named);
  void report(const Failure& failure);
  std::optional<int> read_signal();
  std::vector<pollfd> poll_set() const;

  const LaunchArgs& args_;
  std::string executable_;
  NodeLayout layout_;
  std::optional<Rendezvous> rendezvous_;
  std::optional<OutputRouter> output_;  // from run(), once the layout (and so the tagging) is known
  std::vector<ChildProcess> children_;
  std::optional<fabric::ProcessGuardian> guardian_;  // tears the workers' groups down if we are killed
  std::optional<fabric::HangWatch> hang_watch_;  // maps the local ranks' recorders; judges hangs on one node
  /// Multi-node: this node's one connection to the job's store, which its workers reach through it
  /// (LT_STORE_RELAY; lightning/fabric/internal/store_relay.h). One per attempt.
  std::unique_ptr<fabric::internal::StoreRelay> store_relay_;
  /// --in-memory-replicas: the workers' snapshots, held across restarts (LT_NODE_MEMORY).
  std::optional<fabric::storage::NodeMemoryServer> node_memory_;
  int memory_port_ = 0;  // several nodes: where node_memory_ listens for the other nodes
  std::vector<CpuBinding> numa_;  // --numa-binding: each local rank's CPUs and memory node (empty: none)
  Clock::time_point next_hang_check_;
  struct PendingStatus {
    int64_t request = 0;
    std::filesystem::path dir;       // where the ranks write their stacks
    std::vector<uint32_t> dumps;     // by local rank (HangWatch::request_dumps)
    Clock::time_point deadline;
  };
  std::optional<PendingStatus> status_;
  std::optional<int64_t> status_answered_;  // the newest request answered (unset: none looked for yet)
  Clock::time_point next_status_check_;
  int named_straggler_ = -1;  // the rank last named as the straggler this attempt (-1: none)
  std::vector<std::string> error_files_;
  std::string run_dir_;
  bool remove_run_dir_ = false;
  int signal_fd_ = -1;
  Failure failure_;
  int received_signal_ = 0;
};

Job::~Job() {
  if (rendezvous_) rendezvous_->close_rounds();  // elastic node 0: nodes waiting for a place may go
  if (signal_fd_ >= 0) close(signal_fd_);
  if (remove_run_dir_) {
    std::error_code ignored;
    std::filesystem::remove_all(run_dir_, ignored);
  }
}

std::optional<int> Job::read_signal() {
  signalfd_siginfo info{};
  if (read(signal_fd_, &info, sizeof(info)) != static_cast<ssize_t>(sizeof(info))) return std::nullopt;
  return static_cast<int>(info.ssi_signo);
}

std::vector<pollfd> Job::poll_set() const {
  std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
  for (const auto& child : children_) {
    if (child.running()) fds.push_back({child.pidfd(), POLLIN, 0});
  }
  for (int fd : output_->fds()) fds.push_back({fd, POLLIN, 0});
  return fds;
}

void Job::spawn_all(int attempt) {
  children_.clear();
  error_files_.clear();
  if (node_memory_) {
    node_memory_->clear_staging();  // what workers killed mid-snapshot left
    // Several nodes: each copies its workers' snapshots to the next node of this attempt's group,
    // and reads what it lacks from the others (a new buddy after a lost node gets everything held).
    if (memory_port_ > 0) {
      const auto endpoints = or_stop([&] { return rendezvous_->exchange_memory_endpoints(attempt, memory_port_); });
      node_memory_->set_peers(layout_.node_rank, endpoints);
      if (endpoints.size() > 1) {
        const size_t buddy = (static_cast<size_t>(layout_.node_rank) + 1) % endpoints.size();
        say("in-memory replicas: node " + std::to_string(layout_.node_rank) + " copies its snapshots to node " +
            std::to_string(buddy) + " (" + endpoints[buddy] + ")");
      }
    }
  }
  const auto attempt_dir = std::filesystem::path(run_dir_) / ("attempt_" + std::to_string(attempt));
  std::filesystem::create_directories(attempt_dir);
  NodeLayout layout = layout_;
  layout.attempt = attempt;
  if (!rendezvous_->elastic()) layout.restart_count = attempt;  // elastic: counted by the rounds
  const auto parent = fabric::current_environment();
  std::error_code ignored;
  for (int local = 0; local < layout.local_world_size; ++local) {
    // A recorder left by an earlier run in a reused --log-dir would read as these ranks' own.
    std::filesystem::remove(attempt_dir / ("rank_" + std::to_string(layout.rank_offset + local) + ".flight"), ignored);
  }
  hang_watch_.emplace(attempt_dir.string(), layout.rank_offset, layout.local_world_size, layout.world_size);
  next_hang_check_ = Clock::now();
  store_relay_.reset();
  if (multi_node() && args_.store_relay) {
    try {
      store_relay_ = std::make_unique<fabric::internal::StoreRelay>(
          layout.main_address, layout.main_port, std::chrono::milliseconds(static_cast<int64_t>(args_.rdzv_timeout_s * 1000)));
    } catch (const fabric::RuntimeError& error) {  // node 0's store is out of reach: a lost contact, not a usage error
      throw RendezvousError(std::string(error.what()) + " (this node's store relay, before starting its workers)", 1);
    }
  }
  if (status_) std::filesystem::remove_all(status_->dir, ignored);
  status_.reset();
  named_straggler_ = -1;
  for (int local = 0; local < layout.local_world_size; ++local) {
    const int rank = layout.rank_offset + local;
    const std::string error_file = (attempt_dir / ("rank_" + std::to_string(rank) + ".error.json")).string();
    auto [out, err] = output_->open_worker(rank, local, attempt);
    fabric::ProcessSpec spec;
    spec.executable = executable_;
    spec.argv.push_back(args_.binary);
    spec.argv.insert(spec.argv.end(), args_.binary_args.begin(), args_.binary_args.end());
    spec.env = worker_environment(args_, layout, local, parent, error_file);
    add_attempt_environment(spec.env, attempt_dir.string(), layout.num_nodes);
    if (store_relay_) spec.env[fabric::env::kStoreRelay] = store_relay_->address();
    if (node_memory_) {
      spec.env[fabric::env::kNodeMemory] = node_memory_->address();
      spec.env[fabric::env::kInMemoryReplicas] = std::to_string(args_.in_memory_replicas);
      spec.env[fabric::env::kNodeMemoryStaging] = node_memory_->staging_folder();
    }
    // The console is a terminal: progress bars may redraw in place (the router forwards them).
    if (::isatty(STDERR_FILENO) == 1) spec.env[fabric::env::kTerminal] = "1";
    spec.stdout_fd = out;
    spec.stderr_fd = err;
    spec.guardian_pipe = guardian_->pipe();
    if (static_cast<size_t>(local) < numa_.size()) {
      spec.cpu_affinity = numa_[static_cast<size_t>(local)].cpus;
      spec.preferred_memory_node = numa_[static_cast<size_t>(local)].node;
    }
    try {
      children_.push_back(ChildProcess::spawn(spec));
    } catch (...) {
      close(out);
      close(err);
      throw;
    }
    close(out);
    close(err);
    error_files_.push_back(error_file);
  }
}

void Job::read_output_for(Millis slice) {
  std::vector<pollfd> fds;
  for (int fd : output_->fds()) fds.push_back({fd, POLLIN, 0});
  if (fds.empty()) {
    poll(nullptr, 0, static_cast<int>(slice.count()));
    return;
  }
  if (poll(fds.data(), fds.size(), static_cast<int>(slice.count())) <= 0) return;
  for (const auto& entry : fds) {
    if ((entry.revents & (POLLIN | POLLHUP | POLLERR)) != 0) output_->on_readable(entry.fd);
  }
}

void Job::stop_workers(int signal) {
  fabric::terminate_all(children_, signal, seconds(args_.shutdown_grace_s), [this](Millis slice) { read_output_for(slice); });
  output_->drain(200);
}

std::vector<std::string> Job::exit_states() const {
  std::vector<std::string> exited;
  for (const auto& child : children_) exited.push_back(child.status() ? child.status()->describe() : std::string());
  return exited;
}

void Job::answer_status(int attempt) {
  if (!hang_watch_) return;
  if (!status_) {
    if (Clock::now() < next_status_check_) return;
    next_status_check_ = Clock::now() + kStatusPoll;
    const int64_t newest = or_stop([&] { return rendezvous_->status_requests(); });
    // A node that joins a running job answers the requests from now on, not the past ones.
    if (!status_answered_) status_answered_ = std::max<int64_t>(0, newest - 1);
    if (newest <= *status_answered_) return;
    const auto dir = std::filesystem::path(run_dir_) / ("attempt_" + std::to_string(attempt)) / "status" /
                     (std::to_string(newest) + "-node" + std::to_string(layout_.node_rank));
    status_ = PendingStatus{newest, dir, hang_watch_->request_dumps(dir.string(), exit_states()), Clock::now() + kStatusWait};
  }
  if (!hang_watch_->dumps_answered(status_->dumps, exit_states()) && Clock::now() < status_->deadline) return;
  const std::string text = rendezvous_->describe_node(layout_.node_rank) + ": ranks " + std::to_string(layout_.rank_offset) +
                           "-" + std::to_string(layout_.rank_offset + layout_.local_world_size - 1) + " of " +
                           std::to_string(layout_.world_size) + ", attempt " + std::to_string(attempt) + "\n" +
                           hang_watch_->status(exit_states(), status_->dir.string(), status_->dumps);
  // Requests that came since the last answer get this one (a few at most: each asker waits).
  for (int64_t request = std::max(*status_answered_ + 1, status_->request - 7); request <= status_->request; ++request) {
    or_stop([&] { rendezvous_->answer_status(request, text); });
  }
  status_answered_ = status_->request;
  std::error_code ignored;
  std::filesystem::remove_all(status_->dir, ignored);
  status_.reset();
}

// One node: when the recorders show a hang, dump, report and stop the job (exit code 86).
std::optional<Outcome> Job::check_for_hang(int attempt) {
  if (!hang_watch_ || !judges_hangs() || Clock::now() < next_hang_check_) return std::nullopt;
  next_hang_check_ = Clock::now() + Millis(hang_watch_->period_ms());
  const auto verdict = hang_watch_->check(exit_states());
  if (!verdict) {
    report_straggler();
    return std::nullopt;
  }
  const std::string report = hang_watch_->dump(*verdict, std::chrono::seconds(3), [this](Millis slice) { read_output_for(slice); });
  say(report);
  const int local = std::clamp(verdict->blamed_rank - layout_.rank_offset, 0, static_cast<int>(children_.size()) - 1);
  return fail(attempt, {layout_.node_rank, layout_.rank_offset + local, local, fabric::kHangExitCode,
                        "hang detected: " + verdict->cause, error_files_[local]});
}

// After an attempt: this node's ranks' step-time percentiles (written by each rank's Fabric).
void Job::report_step_times(int attempt) const {
  const auto dir = std::filesystem::path(run_dir_) / ("attempt_" + std::to_string(attempt));
  std::vector<std::string> files;
  for (int local = 0; local < layout_.local_world_size; ++local) {
    files.push_back((dir / ("rank_" + std::to_string(layout_.rank_offset + local) + ".steps")).string());
  }
  const std::string times = fabric::internal::describe_step_times(files, layout_.rank_offset);
  if (!times.empty()) say("step times (between optimizer steps) on node " + std::to_string(layout_.node_rank) + ": " + times);
  if (node_memory_) {
    auto mb = [](int64_t bytes) { return std::to_string((bytes + (1 << 19)) >> 20) + " MB"; };
    say("in-memory replicas on node " + std::to_string(layout_.node_rank) + ": " + mb(node_memory_->bytes_held()) +
        " of this node's snapshots and " + mb(node_memory_->copied_bytes_held()) + " for other nodes held now, at most " +
        mb(node_memory_->peak_bytes_held()) + " at once");
  }
}

// One node: names the rank that holds the job back, once each time another rank becomes it (with
// the ranks' own threshold, which --straggler-threshold sets).
void Job::report_straggler() {
  const auto straggler = hang_watch_->straggler();
  if (!straggler || straggler->first.rank == named_straggler_) return;
  named_straggler_ = straggler->first.rank;
  say(straggler->second);
}

Outcome Job::fail(int attempt, Failure failure) {
  failure_ = std::move(failure);
  if (multi_node() && failure_.local_rank >= 0) {
    // A worker that lost a peer says so by address (gloo): name the node, here and on every node.
    std::string text = fabric::read_error_file(failure_.error_file);
    for (const auto& line : output_->tail(failure_.global_rank)) text += "\n" + line;
    failure_.summary += trace_blame(attempt, rendezvous_->nodes_named_in(text));
    announce_or_stop(attempt, {layout_.node_rank, failure_.global_rank, failure_.exit_code, failure_.summary, false,
                               failure_.suspects});
  }
  stop_workers(SIGTERM);
  return Outcome::Failed;
}

std::string Job::trace_blame(int attempt, const std::vector<NamedNode>& named) {
  std::vector<int> nodes;
  std::vector<std::string> descriptions;
  for (const NamedNode& node : named) {
    nodes.push_back(node.node_rank);
    descriptions.push_back(node.description);
  }
  or_stop([&] { rendezvous_->publish_suspects(attempt, nodes); });
  if (nodes.empty()) return "";
  const SuspectTrace trace = or_stop([&] { return rendezvous_->trace_suspects(attempt, nodes, kBlameTraceLimit); });
  failure_.suspects = trace.lost;
  const auto list = [this](const std::vector<int>& ranks) {
    std::vector<std::string> described;
    for (int node : ranks) described.push_back(rendezvous_->describe_node(node));
    return fabric::join_names(described);
  };
  const std::string names = fabric::join_names(descriptions);
  if (!trace.followed) return "; its error names " + names + ", whose machine or network may be down";
  std::string began;
  if (!trace.lost.empty()) began += list(trace.lost) + ", whose machine or network may be down";
  if (!trace.failed.empty()) {
    began += (began.empty() ? "" : "; and at ") + list(trace.failed) + ", whose own worker failed first (" +
             (trace.failed.size() > 1 ? "their lightning-runs print" : "its lightning-run prints") + " the details)";
  }
  return "; its error names " + names + ": the failure began at " + began;
}

Outcome Job::run_attempt(int attempt) {
  spawn_all(attempt);
  std::optional<Clock::time_point> finish_deadline;
  size_t succeeded = 0;
  while (true) {
    auto fds = poll_set();
    int timeout_ms = -1;
    if (multi_node()) timeout_ms = 100;
    if (hang_watch_ && judges_hangs()) timeout_ms = hang_watch_->period_ms();
    timeout_ms = timeout_ms < 0 ? static_cast<int>(kStatusPoll.count()) : std::min<int>(timeout_ms, kStatusPoll.count());
    if (finish_deadline) {
      const auto left = std::chrono::duration_cast<Millis>(*finish_deadline - Clock::now()).count();
      timeout_ms = static_cast<int>(std::max<int64_t>(0, timeout_ms < 0 ? left : std::min<int64_t>(left, timeout_ms)));
    }
    const int ready = poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));

    if (ready > 0 && (fds[0].revents & POLLIN) != 0) {
      if (auto sig = read_signal()) {
        if (forwarded_only(args_, *sig)) {
          say("forwarding " + fabric::signal_name(*sig) + " to the workers; the job goes on");
          for (auto& child : children_) {
            if (child.running()) child.signal_group(*sig);
          }
        } else if (*sig != SIGCHLD) {
          received_signal_ = *sig;
          say("received " + fabric::signal_name(*sig) + ": forwarding it to the workers and stopping them (grace " +
              format_seconds(args_.shutdown_grace_s) + "s)");
          if (rendezvous_ && multi_node()) {
            announce_or_stop(attempt, {layout_.node_rank, layout_.rank_offset, 128 + *sig,
                                       "lightning-run on node " + std::to_string(layout_.node_rank) + " received " +
                                           fabric::signal_name(*sig), false});
          }
          stop_workers(*sig);
          return Outcome::Signalled;
        }
      }
    }
    for (size_t i = 0; i < children_.size(); ++i) {
      ChildProcess& child = children_[i];
      if (!child.running() || !child.try_reap()) continue;
      const ExitStatus status = *child.status();
      if (status.success()) {
        ++succeeded;
        if (args_.finish_timeout_s > 0 && !finish_deadline) finish_deadline = Clock::now() + seconds(args_.finish_timeout_s);
        continue;
      }
      return fail(attempt, {layout_.node_rank, layout_.rank_offset + static_cast<int>(i), static_cast<int>(i),
                            status.shell_code(), status.describe(), error_files_[i]});
    }
    for (size_t k = 1; k < fds.size(); ++k) {
      if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) != 0) output_->on_readable(fds[k].fd);
    }
    if (succeeded == children_.size()) {
      stop_workers(SIGTERM);  // what the workers started and left running goes with them, as under torchrun
      return Outcome::Success;
    }
    if (auto hung = check_for_hang(attempt)) return *hung;
    answer_status(attempt);
    if (finish_deadline && Clock::now() >= *finish_deadline) {
      const auto running = std::find_if(children_.begin(), children_.end(), [](const auto& c) { return c.running(); });
      const int i = running == children_.end() ? 0 : static_cast<int>(running - children_.begin());
      return fail(attempt, {layout_.node_rank, layout_.rank_offset + i, i, kFinishTimeoutExitCode,
                            "still running " + format_seconds(args_.finish_timeout_s) +
                                "s after another worker finished (--finish-timeout)",
                            error_files_[static_cast<size_t>(i)]});
    }
    if (multi_node()) {
      if (auto remote = watch_other_nodes(attempt, true)) return fail(attempt, *remote);
    }
  }
}

void Job::announce_or_stop(int attempt, const RemoteFailure& failure) {
  or_stop([&] { rendezvous_->announce_failure(attempt, failure); });
}

std::optional<Failure> Job::watch_other_nodes(int attempt, bool may_regroup) {
  return or_stop([&]() -> std::optional<Failure> {
    if (auto remote = rendezvous_->failure(attempt)) {
      return Failure{remote->node_rank, remote->global_rank, -1, remote->exit_code, remote->summary, {}, remote->regroup,
                     remote->suspects};
    }
    std::optional<Failure> failure;
    const std::vector<LostNode> lost = rendezvous_->watch_nodes(attempt);
    if (!lost.empty()) {
      // global rank -1: a node, not one of its ranks, failed.
      failure = Failure{lost.front().node_rank, -1, -1, 1, lost_nodes_summary(lost, layout_.num_nodes, args_.node_timeout_s), {}};
    } else if (may_regroup && rendezvous_->elastic()) {
      const std::vector<std::string> waiting = rendezvous_->nodes_waiting();
      if (!waiting.empty()) {
        failure = Failure{0, -1, -1, 1, std::to_string(waiting.size()) + " node(s) waiting to join (" +
                                            fabric::join_names(waiting) + "): re-forming the group with them", {}, true};
      }
    }
    if (failure) {
      rendezvous_->announce_failure(attempt, {failure->node_rank, failure->global_rank, failure->exit_code, failure->summary,
                                              failure->regroup});
    }
    return failure;
  });
}

void Job::report(const Failure& failure) {
  if (failure.global_rank < 0) {
    say(failure.summary + "; stopped this node's workers");
    return;
  }
  if (failure.local_rank < 0) {
    say("rank " + std::to_string(failure.global_rank) + " on node " + std::to_string(failure.node_rank) +
        " failed first: " + failure.summary + " (node " + std::to_string(failure.node_rank) +
        "'s lightning-run prints its details); stopped this node's workers");
    return;
  }
  say("rank " + std::to_string(failure.global_rank) + " (node " + std::to_string(failure.node_rank) + ", local rank " +
      std::to_string(failure.local_rank) + ") failed first: " + failure.summary);
  if (hang_watch_ && judges_hangs() && failure.exit_code != fabric::kHangExitCode) {
    const std::string positions = hang_watch_->positions(exit_states());
    if (!positions.empty()) say("collectives of this node's ranks at the failure (flight recorder):\n" + positions);
  }
  const std::string error = fabric::read_error_file(failure.error_file);
  if (!error.empty()) say("its error file says: " + error);
  const auto tail = output_->tail(failure.global_rank);

  if (!tail.empty()) {
    std::ostringstream lines;
    lines << "last " << tail.size() << " line(s) of rank " << failure.global_rank << ":";
    for (const auto& line : tail) lines << "\n  | " << line;
    say(lines.str());
  }
  say("stopped the other workers (SIGTERM, then SIGKILL after " + format_seconds(args_.shutdown_grace_s) + "s)");
}

int Job::wait_for_other_nodes(int attempt) {
  rendezvous_->announce_done(attempt);
  if (layout_.node_rank != 0) return 0;
  // Node 0 hosts the store the other nodes' workers use: keep it until every node is done.
  while (!rendezvous_->all_done(attempt)) {
    answer_status(attempt);  // its ranks have exited: their last step and collective
    if (auto remote = watch_other_nodes(attempt, false)) {
      failure_ = *remote;
      report(failure_);
      return failure_.exit_code;
    }
    pollfd fd{signal_fd_, POLLIN, 0};
    if (poll(&fd, 1, 100) > 0) {
      if (auto sig = read_signal(); sig && *sig != SIGCHLD && !forwarded_only(args_, *sig)) {
        say("received " + fabric::signal_name(*sig) + " while waiting for the other nodes to finish");
        return 128 + *sig;
      }
    }
  }
  return 0;
}

int Job::run() {
  const int local_count = local_process_count(args_);
  executable_ = fabric::resolve_executable(args_.binary);
  guardian_.emplace();  // before any thread exists (the rendezvous store starts some)
  sigset_t signals = launcher_signals(args_);
  signal_fd_ = signalfd(-1, &signals, SFD_CLOEXEC);
  if (signal_fd_ < 0) throw std::runtime_error(std::string("signalfd: ") + std::strerror(errno));
  // The signals --signals-to-handle leaves out take their default action, as under torchrun (the
  // guardian then stops the workers): block_launcher_signals blocked them all.
  sigset_t unhandled;
  sigemptyset(&unhandled);
  for (const auto& entry : handleable_signals()) {
    if (sigismember(&signals, entry.second) != 1) sigaddset(&unhandled, entry.second);
  }
  pthread_sigmask(SIG_UNBLOCK, &unhandled, nullptr);
  if (args_.numa_binding) {
    numa_ = numa_binding_for_job(args_, local_count, say);
    say("--numa-binding " + *args_.numa_binding + ": " + describe_numa_binding(numa_));
  }

  if (args_.in_memory_replicas > 0) node_memory_.emplace();
  rendezvous_.emplace(Rendezvous::establish(args_, local_count));
  // Several nodes: the memory server answers the other nodes' servers that know the job's run id.
  if (node_memory_ && (args_.num_nodes > 1 || args_.elastic)) memory_port_ = node_memory_->listen_for_peers(rendezvous_->layout().run_id);
  if (rendezvous_->elastic()) rendezvous_->form_group(std::nullopt, say, [this] { stop_on_signal(); });
  layout_ = rendezvous_->layout();
  OutputOptions output;
  output.tag = args_.tag_output.value_or(layout_.world_size > 1);
  output.timestamp = args_.timestamp_output;
  output.console_local_ranks = args_.local_ranks_filter;
  output.log_dir = args_.log_dir;
  output_.emplace(output);

  if (args_.log_dir) {
    run_dir_ = *args_.log_dir;
  } else {
    run_dir_ = fabric::make_temporary_directory("lightning-run-");
    remove_run_dir_ = true;
  }
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    say("OMP_NUM_THREADS=" + std::to_string(default_omp_threads(local_count)) + " for each of " +
        std::to_string(local_count) + " worker(s) (cores / workers); set OMP_NUM_THREADS to choose");
  }
  say_layout();

  for (int attempt = layout_.attempt;; ++attempt) {
    if (attempt > 0 && layout_.num_nodes > 1 && !rendezvous_->elastic()) rendezvous_->wait_for_attempt(attempt);
    const Outcome outcome = run_attempt(attempt);
    report_step_times(attempt);
    if (outcome == Outcome::Success) return multi_node() ? wait_for_other_nodes(attempt) : 0;
    if (outcome == Outcome::Signalled) {
      say("stopped; exiting with " + std::to_string(128 + received_signal_));
      return 128 + received_signal_;
    }
    report(failure_);
    if (failure_.exit_code == fabric::kHangExitCode && remove_run_dir_) {
      remove_run_dir_ = false;
      say("kept " + run_dir_ + " for the hang dumps (--log-dir chooses the folder)");
    }
    const bool node_lost = failure_.global_rank < 0 && !failure_.regroup;
    if (rendezvous_->elastic()) {
      if (regroup_after(attempt)) {
        attempt = layout_.attempt - 1;  // the loop's ++ makes it the new group's
        continue;
      }
    } else if (attempt < args_.max_restarts && !node_lost) {
      say("restarting the job: attempt " + std::to_string(attempt + 2) + " of " + std::to_string(args_.max_restarts + 1));
      output_->reset();
      continue;
    }
    if (node_lost && !rendezvous_->elastic() && attempt < args_.max_restarts) {
      say("not restarting: a lost node cannot rejoin a job of fixed --num-nodes (an elastic job, --num-nodes MIN:MAX, "
          "would go on without it)");
    } else if (args_.max_restarts > 0) {
      say("no restarts left (--max-restarts=" + std::to_string(args_.max_restarts) + ")");
    }
    // Node 0 hosts the store: keep it until the other nodes have read the failure.
    if (multi_node() && layout_.node_rank == 0) rendezvous_->wait_until_failure_seen(attempt, std::chrono::seconds(5));
    say("exiting with " + std::to_string(failure_.exit_code));
    return failure_.exit_code;
  }
}

void Job::stop_on_signal() {
  pollfd fd{signal_fd_, POLLIN, 0};
  if (poll(&fd, 1, 0) <= 0) return;
  const auto sig = read_signal();
  if (!sig || *sig == SIGCHLD || forwarded_only(args_, *sig)) return;
  throw RendezvousError("received " + fabric::signal_name(*sig) + " while waiting in the rendezvous; exiting with " +
                            std::to_string(128 + *sig),
                        128 + *sig);
}

void Job::say_layout() const {
  // An IPv6 address in brackets, so that `lightning-run status` takes the printed address as it is.
  const bool v6 = layout_.main_address.find(':') != std::string::npos;
  say("node " + std::to_string(layout_.node_rank) + " of " + std::to_string(layout_.num_nodes) + ": ranks " +
      std::to_string(layout_.rank_offset) + "-" + std::to_string(layout_.rank_offset + layout_.local_world_size - 1) +
      " of " + std::to_string(layout_.world_size) + ", rendezvous at " + (v6 ? "[" + layout_.main_address + "]" : layout_.main_address) +
      ":" + std::to_string(layout_.main_port));
  // Node 0 names the group: each node as it announced itself (--local-addr, else its host name).
  if (layout_.node_rank == 0 && layout_.num_nodes > 1) say("nodes by rank: " + fabric::join_names(rendezvous_->node_names()));
}

bool Job::regroup_after(int attempt) {
  // Every node decides from the failure announced first, so that all take the same way.
  std::optional<RemoteFailure> first = rendezvous_->failure(attempt);
  const bool regroup = first ? first->regroup : failure_.regroup;
  if (!regroup && layout_.restart_count >= args_.max_restarts) return false;
  if (regroup) {
    say("re-forming the group for the waiting node(s); this restart does not count against --max-restarts");
  } else {
    say("restarting the job with the nodes that remain: restart " + std::to_string(layout_.restart_count + 1) + " of " +
        std::to_string(args_.max_restarts) + " (--max-restarts)");
  }
  output_->reset();
  rendezvous_->form_group(AttemptEnd{!regroup, first ? first->suspects : failure_.suspects}, say, [this] { stop_on_signal(); });
  layout_ = rendezvous_->layout();
  say_layout();
  return true;
}

}  // namespace

void block_launcher_signals() {
  sigset_t signals = all_launcher_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int run_job(const LaunchArgs& args) {
  try {
    Job job(args);
    return job.run();
  } catch (const RendezvousError& error) {
    say(error.what());
    return error.exit_code();
  } catch (const fabric::Error& error) {
    say(error.what());
    return 2;
  } catch (const std::exception& error) {
    say(std::string("internal error: ") + error.what());
    return 1;
  }
}

int print_dry_run(const LaunchArgs& args) {
  try {
    const int local_count = local_process_count(args);
    const std::string executable = fabric::resolve_executable(args.binary);
    NodeLayout layout;
    layout.node_rank = args.node_rank;
    layout.num_nodes = args.num_nodes;
    layout.local_world_size = local_count;
    layout.rank_offset = args.node_rank * local_count;  // assumes every node runs as many workers
    layout.world_size = args.num_nodes * local_count;
    layout.main_address = args.main_address;
    layout.main_port = args.main_port.value_or(kDefaultMainPort);
    layout.run_id = "<chosen at start>";
    layout.max_restarts = args.max_restarts;
    const auto parent = fabric::current_environment();
    std::cout << "lightning-run: dry run: " << local_count << " worker(s) on node " << args.node_rank << " of "
              << args.num_nodes << "; nothing is started. Each worker also inherits this environment.\n";
    if (args.elastic) {
      std::cout << "lightning-run: elastic (--num-nodes " << args.elastic->min << ":" << args.elastic->max
                << "): each rendezvous round assigns node ranks; shown as node 0 of " << args.num_nodes << "\n";
    }
    if (args.num_nodes > 1) std::cout << "lightning-run: global ranks assume every node runs " << local_count << " worker(s)\n";
    if (args.numa_binding) {
      const auto numa = numa_binding_for_job(args, local_count, [](const std::string& note) {
        std::cout << "lightning-run: " << note << "\n";
      });
      std::cout << "lightning-run: --numa-binding " << *args.numa_binding << ": " << describe_numa_binding(numa) << "\n";
    }
    const bool free_port = args.num_nodes == 1 && !args.main_port;
    const std::string run_dir = args.log_dir.value_or("<run dir>");
    if (!args.log_dir) std::cout << "lightning-run: <run dir> is a new temporary folder (or --log-dir)\n";
    for (int local = 0; local < local_count; ++local) {
      auto env = worker_environment(args, layout, local, parent, run_dir + "/attempt_0/rank_" +
                                                                      std::to_string(layout.rank_offset + local) +
                                                                      ".error.json");
      add_attempt_environment(env, run_dir + "/attempt_0", layout.num_nodes);
      if (free_port) env[fabric::env::kMasterPort] = "<free port chosen at start>";
      std::ostringstream line;
      line << "[rank " << layout.rank_offset + local << "] env";
      for (const auto& [key, value] : env) {
        auto inherited = parent.find(key);
        if (inherited == parent.end() || inherited->second != value) line << ' ' << key << '=' << shell_quote(value);
      }
      line << ' ' << shell_quote(executable);
      for (const auto& arg : args.binary_args) line << ' ' << shell_quote(arg);
      std::cout << line.str() << '\n';
    }
    return 0;
  } catch (const fabric::Error& error) {
    say(error.what());
    return 2;
  }
}

}  // namespace lightning::launcher
