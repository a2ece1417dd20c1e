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
//     kHangExitCode. The other ranks end with it after dumping.
// Dump files: <dir>/rank_<R>.flight.txt (the recorder) and <dir>/rank_<R>.stack.txt (the native
// stack of the thread that issued the collectives).
#pragma once

#include <chrono>
#include <string>

namespace lightning::fabric::internal {

struct WatchdogSettings {
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds hang_timeout{0};  // > 0
  bool launcher_watches = false;              // LT_FLIGHT_DIR: the launcher reads the recorders
  std::string store_host;                     // store mode: the job's TCPStore
  int store_port = 0;
  std::string store_prefix;                   // e.g. /worker/attempt_0
  std::string dump_dir;                       // LT_HANG_DUMP_DIR; empty: rank 0 picks one
  std::string error_file;                     // TORCHELASTIC_ERROR_FILE, may be empty
};

/// Starts the process's watchdog (a no-op while one runs or without a flight recorder).
/// Returns true when this call started it: the caller then stops it.
bool start_hang_watchdog(const WatchdogSettings& settings);
/// Stops and joins it.
void stop_hang_watchdog();

/// Writes this rank's dump files into dir (created); returns the files written. Any thread.
std::string write_rank_dump(const std::string& dir);

}  // namespace lightning::fabric::internal
