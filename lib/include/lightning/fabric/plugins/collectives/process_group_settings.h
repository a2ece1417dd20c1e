// How a strategy's process group forms and behaves: one settings type, composed into every
// multi-process strategy's options (DDPOptions::process_group, FSDPOptions::process_group, a user
// strategy's options), with its defaults written here once. The environment wins over code:
// with_environment_overrides applies every variable that overrides a setting, in one place.
#pragma once

#include "lightning/fabric/export.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric {

/// The c10d backend that moves a process group's tensors.
enum class ProcessGroupBackend {
  Gloo,  // CPU tensors, any number of machines
  Nccl,  // CUDA tensors (a CUDA LibTorch with NCCL)
  Shm,   // CPU tensors, every rank on one machine: the project's shared-memory backend
  /// CPU tensors on several machines with the same number of ranks each: all-reduce through shm
  /// inside each machine and gloo between them; every other collective on gloo.
  ShmGloo,
};
/// Every backend, in the order error messages list them.
inline constexpr ProcessGroupBackend kProcessGroupBackends[] = {ProcessGroupBackend::Gloo, ProcessGroupBackend::Nccl,
                                                                ProcessGroupBackend::Shm, ProcessGroupBackend::ShmGloo};
/// "gloo", "nccl", "shm", "shm+gloo".
LF_API std::string to_string(ProcessGroupBackend backend);
/// The backend named text ("gloo", "nccl", "shm" or "shm+gloo"). ValueError naming `setting` (the option or
/// variable it came from), the value and the choices otherwise.
LF_API ProcessGroupBackend parse_process_group_backend(const std::string& text, const std::string& setting);

struct LF_API ProcessGroupSettings {
  /// Of every collective and of the store once the group formed.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  /// How long ranks wait for each other to join the group; a rank that never arrives (it failed
  /// before joining) ends the job after this, naming it. LT_RENDEZVOUS_TIMEOUT (seconds) wins.
  std::chrono::milliseconds rendezvous_timeout = std::chrono::minutes(5);
  /// A rank blocked in one collective this long is a hang: the job is reported and ended with exit
  /// code 86 (docs/launcher.md, "When a job hangs"). 0 turns detection off. LT_HANG_TIMEOUT
  /// (seconds; lightning-run --hang-timeout) wins.
  std::chrono::milliseconds hang_timeout = std::chrono::minutes(5);
  /// A rank that arrives last at 80 % of the last 32 collectives, by a median of at least this many
  /// seconds, is named as the job's straggler while it runs (docs/launcher.md, "Stragglers"); 0
  /// turns the check off. Judged with hang detection, so hang_timeout 0 turns it off too.
  /// LT_STRAGGLER_THRESHOLD (seconds; lightning-run --straggler-threshold) wins.
  double straggler_threshold_s = 0.05;
  /// Unset: nccl on CUDA; on CPU (checked when the group forms) shm when every rank is on one
  /// machine, shm+gloo when the ranks are on several machines with at least 2 each and the same
  /// number on every one, else gloo. LT_PROCESS_GROUP_BACKEND (lightning-run --process-group-backend) wins.
  std::optional<ProcessGroupBackend> backend;
  /// Collectives each rank's flight recorder keeps; 0 turns recording and hang detection off.
  /// LT_FLIGHT_RECORDS wins.
  uint32_t flight_records = 2048;
  /// Compare every collective's op, dtype and shape across ranks before it runs (one small
  /// all_gather each; the shm backend always does). LT_CHECK_COLLECTIVES wins.
  bool check_collectives = false;
  /// The network interface gloo sends through (e.g. "eth1"). Empty: 127.0.0.1 when the job's
  /// address is a loopback one, else the interface of this host's name. GLOO_SOCKET_IFNAME wins.
  std::string socket_interface;
  /// Where hang dumps go; empty: rank 0 picks. LT_HANG_DUMP_DIR wins.
  std::string hang_dump_dir;
  /// Set by launchers through the environment, rarely in code: LT_FLIGHT_DIR (lightning-run's
  /// folder of recorder files, which it maps for `lightning-run status` and, with
  /// launcher_judges_hangs, to judge hangs), LT_HANG_JUDGE ("launcher" or "ranks": whether
  /// lightning-run or rank 0 through the store judges; lightning-run on several nodes sets "ranks")
  /// and TORCHELASTIC_ERROR_FILE (where rank 0's hang report also goes).
  std::string flight_dir;
  bool launcher_judges_hangs = true;
  std::string error_file;
};

/// ValueError naming `owner` (e.g. "DDPOptions") unless the timeouts are valid.
LF_API void check_process_group_settings(const std::string& owner, const ProcessGroupSettings& settings);

/// settings with every environment variable that overrides one applied, through env::Reader:
/// LT_PROCESS_GROUP_BACKEND, LT_RENDEZVOUS_TIMEOUT, LT_HANG_TIMEOUT, LT_STRAGGLER_THRESHOLD, LT_FLIGHT_RECORDS,
/// LT_CHECK_COLLECTIVES, GLOO_SOCKET_IFNAME, LT_HANG_DUMP_DIR, LT_FLIGHT_DIR, LT_HANG_JUDGE and
/// TORCHELASTIC_ERROR_FILE. ValueError naming the variable, its value and what is valid.
LF_API ProcessGroupSettings with_environment_overrides(ProcessGroupSettings settings, const env::EnvLookup& env);

}  // namespace lightning::fabric
