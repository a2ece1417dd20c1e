// The launcher <-> runtime contract (docs/launcher.md): the name of every environment variable that
// lightning-run sets and the runtime reads, and env::Reader, through which the runtime parses them.
// Tests on both sides pin these names.
#pragma once

#include "lightning/fabric/export.h"

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace lightning::fabric::env {

// Set by lightning-run.
inline constexpr const char* kCliUsed = "LT_CLI_USED";          // "1": launched by the CLI
inline constexpr const char* kAccelerator = "LT_ACCELERATOR";   // only when --accelerator given
inline constexpr const char* kStrategy = "LT_STRATEGY";         // only when --strategy given
inline constexpr const char* kPrecision = "LT_PRECISION";       // only when --precision given
inline constexpr const char* kDevices = "LT_DEVICES";           // always
inline constexpr const char* kNumNodes = "LT_NUM_NODES";        // always
inline constexpr const char* kTerminal = "LT_TERMINAL";          // "1": the console is a terminal (progress redraws)

// Read by the runtime, set by the user (any launcher).
inline constexpr const char* kRendezvousTimeout = "LT_RENDEZVOUS_TIMEOUT";  // seconds ranks wait to arrive
inline constexpr const char* kHangTimeout = "LT_HANG_TIMEOUT";       // seconds in a collective = hang; 0 off
inline constexpr const char* kStragglerThreshold = "LT_STRAGGLER_THRESHOLD";  // seconds behind = straggler; 0 off
inline constexpr const char* kFlightRecords = "LT_FLIGHT_RECORDS";   // flight recorder ring size; 0 off
inline constexpr const char* kHangDumpDir = "LT_HANG_DUMP_DIR";      // where hang dumps are written
inline constexpr const char* kProcessGroupBackend = "LT_PROCESS_GROUP_BACKEND";  // gloo | nccl | shm: wins over code
inline constexpr const char* kCheckCollectives = "LT_CHECK_COLLECTIVES";  // "1": compare every call across ranks
inline constexpr const char* kGlooSocketInterface = "GLOO_SOCKET_IFNAME";  // the interface gloo uses
inline constexpr const char* kProfile = "LT_PROFILE";              // "10-15": trace those optimizer steps
inline constexpr const char* kProfileRanks = "LT_PROFILE_RANKS";   // "0,2": only these global ranks
inline constexpr const char* kProfileDir = "LT_PROFILE_DIR";       // where trace-rank<R>.json files go
// Set by lightning-run on every node: recorder files live here, mapped by the launcher for its
// status view, and on one node also to judge hangs.
inline constexpr const char* kFlightDir = "LT_FLIGHT_DIR";
// Set by lightning-run with LT_FLIGHT_DIR: "launcher" (one node: it judges hangs from the files) or
// "ranks" (several nodes: the ranks judge through the store). Unset with LT_FLIGHT_DIR: launcher.
inline constexpr const char* kHangJudge = "LT_HANG_JUDGE";
// Set by lightning-run on the nodes of a multi-node job: the abstract socket of this node's store
// relay; the ranks reach the job's store through it (one connection per node to the main store).
inline constexpr const char* kStoreRelay = "LT_STORE_RELAY";
// Set by lightning-run --in-memory-replicas K: the abstract socket of this node's memory store
// (storage/node_memory.h; memory:// objects), and K, how often fabric.snapshot() takes one.
inline constexpr const char* kNodeMemory = "LT_NODE_MEMORY";
inline constexpr const char* kInMemoryReplicas = "LT_IN_MEMORY_REPLICAS";
// With LT_NODE_MEMORY: the folder of /dev/shm where the ranks stage what they put (removed by
// lightning-run with anything a killed rank left there).
inline constexpr const char* kNodeMemoryStaging = "LT_NODE_MEMORY_STAGING";
// Set by lightning-run on every node: each rank writes rank_<R>.steps (its step-time percentiles) here.
inline constexpr const char* kStepTimesDir = "LT_STEP_TIMES_DIR";
// Set by lightning-run: the number of this start of the workers, counting every restart (after a
// failure or a change of membership); names the workers' store prefix /worker/attempt_<N>. Without
// it (torchrun) the prefix follows TORCHELASTIC_RESTART_COUNT.
inline constexpr const char* kAttempt = "LT_ATTEMPT";
// Set by lightning-run --virtual-local-rank: "1". LOCAL_RANK is 0 in every worker and, on CUDA,
// CUDA_VISIBLE_DEVICES holds the worker's one GPU: the runtime runs each process on device index 0
// while the node still counts LOCAL_WORLD_SIZE processes.
inline constexpr const char* kVirtualLocalRank = "LT_VIRTUAL_LOCAL_RANK";
// The GPUs a process sees (CUDA's own variable); lightning-run --virtual-local-rank sets it per worker.
inline constexpr const char* kCudaVisibleDevices = "CUDA_VISIBLE_DEVICES";

// The torchrun set, as torchrun sets them.
inline constexpr const char* kRank = "RANK";
inline constexpr const char* kLocalRank = "LOCAL_RANK";
inline constexpr const char* kWorldSize = "WORLD_SIZE";
inline constexpr const char* kLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kGroupRank = "GROUP_RANK";
inline constexpr const char* kGroupWorldSize = "GROUP_WORLD_SIZE";
inline constexpr const char* kNodeRank = "NODE_RANK";
inline constexpr const char* kRoleRank = "ROLE_RANK";
inline constexpr const char* kRoleName = "ROLE_NAME";
inline constexpr const char* kRoleWorldSize = "ROLE_WORLD_SIZE";
inline constexpr const char* kMasterAddr = "MASTER_ADDR";
inline constexpr const char* kMasterPort = "MASTER_PORT";
inline constexpr const char* kRunId = "TORCHELASTIC_RUN_ID";
inline constexpr const char* kRestartCount = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char* kMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char* kErrorFile = "TORCHELASTIC_ERROR_FILE";
inline constexpr const char* kUseAgentStore = "TORCHELASTIC_USE_AGENT_STORE";

// Seeding, shared with Python Lightning.
inline constexpr const char* kGlobalSeed = "PL_GLOBAL_SEED";
inline constexpr const char* kSeedWorkers = "PL_SEED_WORKERS";

/// Reads one variable; nullopt when unset. The Connector and cluster environments take one of
/// these so that tests can hand them an environment without touching the process's own.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// The process environment (getenv).
LF_API EnvLookup process_env();

/// A fixed environment, e.g. for tests and dry runs.
LF_API EnvLookup map_env(std::map<std::string, std::string> values);

/// The one typed reader of the environment: every variable the library parses should go through
/// it, so that a malformed value is reported the same way everywhere. Each accessor returns nullopt (flag:
/// the fallback) when the variable is unset; when it is set but malformed, it throws
/// lightning::fabric::ValueError naming the variable, its value, what it accepts and the fix.
/// An empty value is a value, not "unset": text returns it, the typed accessors reject it.
class LF_API Reader {
 public:
  explicit Reader(EnvLookup lookup = process_env());

  /// The value as it is.
  std::optional<std::string> text(const std::string& name) const;
  /// A whole number, as std::stoll reads it ("42", "-3", "+7", leading blanks allowed); nothing may
  /// follow the digits ("3x" is rejected), nor may it overflow long long.
  std::optional<long long> integer(const std::string& name) const;
  /// As integer, and within [min, max] (e.g. an int, a port); outside it: ValueError with the range.
  std::optional<long long> integer(const std::string& name, long long min, long long max) const;
  /// As integer, within an int's range (a rank, a size).
  std::optional<int> int_value(const std::string& name) const;
  /// A whole number >= 0 that fits 64 bits (a seed): as integer, but "-1" is rejected, not wrapped.
  std::optional<unsigned long long> unsigned_integer(const std::string& name) const;
  /// 1/true/yes turn it on, 0/false/no off, in any case ("True", "FALSE"); anything else throws.
  bool flag(const std::string& name, bool fallback = false) const;
  /// A duration in seconds: a finite number >= 0 ("3", "0.5", "1e3"); "inf", "-1", "3s" are rejected.
  std::optional<double> seconds(const std::string& name) const;

 private:
  EnvLookup lookup_;
};

}  // namespace lightning::fabric::env
