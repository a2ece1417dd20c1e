// lightning-run's command line: Python Fabric's CLI flags with their defaults and choices, our
// supervision flags on top, and everything after the binary passed to it untouched.
#pragma once

#include <csignal>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace lightning::launcher {

inline constexpr int kDefaultMainPort = 29400;

struct LaunchArgs {
  // Fabric's flags. Unset optional = not given (the LT_* variable is then not exported).
  std::optional<std::string> accelerator;
  std::optional<std::string> strategy;
  std::optional<std::string> precision;
  std::string devices = "1";
  int num_nodes = 1;  // fixed size; an elastic job: its MAX
  int node_rank = 0;  // fixed size only (an elastic job's node ranks come from each rendezvous round)
  /// --num-nodes MIN:MAX (also --nnodes, torchrun's spelling): elastic membership; each rendezvous
  /// round forms a group of MIN..MAX nodes (docs/launcher.md, "Elastic membership").
  struct NodeRange {
    int min = 1, max = 1;
  };
  std::optional<NodeRange> elastic;
  std::string main_address = "127.0.0.1";
  std::optional<int> main_port;  // default 29400; a single-node run without it picks a free port

  // Supervision.
  int max_restarts = 0;
  /// --in-memory-replicas K: fabric.snapshot() keeps the state in this launcher's memory every K
  /// steps, and restarted workers resume from it (docs/launcher.md, "In-memory replicas"); 0: off.
  int in_memory_replicas = 0;
  double shutdown_grace_s = 10.0;    // between the polite signal and SIGKILL
  double rdzv_timeout_s = 120.0;     // how long nodes wait for each other
  double rdzv_last_call_s = 30.0;    // elastic: once MIN nodes are in, how long a round waits for more
  double node_timeout_s = 30.0;      // a node not heard from this long is lost (multi-node)
  double finish_timeout_s = 0.0;     // >0: after one worker succeeds, the rest must end within this
  std::optional<double> hang_timeout_s;  // LT_HANG_TIMEOUT for the workers (0 = off); default: the program's (300 s)
  bool check_collectives = false;    // LT_CHECK_COLLECTIVES=1
  bool store_relay = true;           // multi-node: workers reach the store through their node's launcher
  std::optional<double> straggler_threshold_s;  // LT_STRAGGLER_THRESHOLD for the workers (0 = off); default: the program's (0.05 s)
  std::optional<std::string> process_group_backend;  // LT_PROCESS_GROUP_BACKEND when given
  std::optional<std::string> log_dir;
  std::optional<std::string> profile;        // --profile STEPS: LT_PROFILE (validated)
  std::optional<std::string> profile_ranks;  // --profile-ranks: LT_PROFILE_RANKS (validated)
  std::optional<bool> tag_output;    // default: on when the job has more than one worker
  bool timestamp_output = false;
  std::optional<std::set<int>> local_ranks_filter;
  bool dry_run = false;

  // torchrun's flags (docs/launcher.md, "Flags from torchrun").
  std::optional<std::string> numa_binding;  // --numa-binding: node | socket | exclusive | core-complex
  std::optional<std::string> local_addr;    // --local-addr: the address this node announces in the rendezvous
  bool virtual_local_rank = false;          // --virtual-local-rank: LOCAL_RANK=0, one GPU per worker
  /// --signals-to-handle: the signals that stop the job (forwarded to the workers, then the
  /// teardown, exit 128 + signal); the others take their default action, but SIGUSR1 and SIGUSR2,
  /// which are forwarded and the job goes on.
  std::vector<int> signals_to_handle = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};

  std::string binary;
  std::vector<std::string> binary_args;
};

/// The outcome of parsing: either arguments to run, or an exit code to leave with at once
/// (0 after --help/--version, 2 after a usage error, with the message already printed).
struct ParsedCommandLine {
  std::optional<int> exit_now;
  LaunchArgs args;
};

ParsedCommandLine parse_command_line(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

/// Worker processes on this node: cpu -> the devices count; cuda/gpu -> the parsed device list;
/// strategy dp -> 1. Throws lightning::fabric::ValueError on a devices value the accelerator rejects.
int local_process_count(const LaunchArgs& args);

/// "2", "0.5": seconds as a person writes them.
std::string format_seconds(double seconds);

/// The accelerator the workers will use ("cpu" or "cuda"), resolving "auto" and "gpu".
std::string resolved_accelerator(const LaunchArgs& args);

/// CUDA jobs: the GPU index each local rank uses (--devices: "2" -> {0, 1}, "0,2" -> {0, 2}), as
/// the workers' Connector picks them; empty for any other accelerator.
std::vector<int> local_gpu_indices(const LaunchArgs& args);

/// The signals --signals-to-handle may name, with torchrun's spellings: SIGHUP, SIGINT, SIGQUIT,
/// SIGTERM, SIGUSR1, SIGUSR2, SIGALRM, SIGXCPU.
const std::vector<std::pair<std::string, int>>& handleable_signals();

}  // namespace lightning::launcher
