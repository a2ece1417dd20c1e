// The in-rank side of hang detection: one watchdog thread per process, started by the first
// process group (Collective) of a multi-process job and stopped with it.
//
// Every period it beats in the flight recorder. Then, in one of two modes:
//   - launcher mode (LT_FLIGHT_DIR set: lightning-run on one node maps the recorders and judges):
//     when the launcher sets dump_request in the recorder, it writes this rank's dump files;
//   - store mode (torchrun, srun, mpirun, several nodes): it publishes this rank's progress in the
//     job's store, over a connection of its own; rank 0's watchdog reads every rank's, and when
//     some rank has waited in a collective for the hang timeout it asks every rank to dump, writes
//     the report to stderr, the report file and the error file, and ends the process with
//     kHangExitCode. The other ranks end with it after dumping. Each rank also publishes its last
//     collectives' entry times counted back from their leave, and rank 0 names a straggler
//     (hang/straggler.h) on its stderr.
// Dump files: <dir>/rank_<R>.flight.txt (the recorder) and <dir>/rank_<R>.stack.txt (the native
// stack of the thread that issued the collectives).
#pragma once

#include <chrono>
#include <string>

#include "lightning/fabric/plugins/collectives/process_group_settings.h"

namespace lightning::fabric {
namespace flight {
class Recorder;
}

namespace internal {

struct WatchdogSettings {
  int rank = 0;
  int world_size = 1;
  /// hang_timeout (> 0 to watch), flight_records, flight_dir (set: launcher mode, the launcher
  /// reads the recorder files there), hang_dump_dir (empty: rank 0 picks), error_file.
  ProcessGroupSettings group;
  std::string store_host;    // store mode: the job's TCPStore
  int store_port = 0;
  std::string store_prefix;  // e.g. /worker/attempt_0
  std::string store_relay;   // set: reach the store through this node's relay (store_relay.h)
  int local_world_size = 1;  // ranks per node: with a relay, the store has one client per node
};

/// What watch_collectives set up for the process group that called it.
struct CollectiveWatch {
  flight::Recorder* recorder = nullptr;  // the process's recorder; null: recording is off
  bool owns_watchdog = false;            // this call started the watchdog: stop_hang_watchdog when done
};
/// Called by the first process group of a multi-process job: installs this process's flight
/// recorder (once; <flight_dir>/rank_<R>.flight when flight_dir is set) and starts the watchdog.
/// Nothing for one rank or with flight_records 0.
CollectiveWatch watch_collectives(const WatchdogSettings& settings);

/// Starts the process's watchdog (a no-op while one runs or without a flight recorder).
/// Returns true when this call started it: the caller then stops it.
bool start_hang_watchdog(const WatchdogSettings& settings);
/// Stops and joins it.
void stop_hang_watchdog();

/// Writes this rank's dump files into dir (created); returns the files written. Any thread.
std::string write_rank_dump(const std::string& dir);

}  // namespace internal
}  // namespace lightning::fabric
