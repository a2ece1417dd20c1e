// Hang analysis: from every rank's flight-recorder progress, decides whether a job hangs and
// explains it. Pure functions, shared by the ranks' watchdog (store mode) and lightning-run.
#pragma once

#include <string>
#include <vector>

#include "lightning/fabric/hang/flight_recorder.h"

namespace lightning::fabric {

/// The exit code of a job ended by the hang watchdog (lightning-run and the ranks alike).
inline constexpr int kHangExitCode = 86;

struct HangVerdict {
  bool hung = false;
  std::string cause;    // one line: the likely cause, naming ranks and collectives
  std::string report;   // the whole report: headline, one line per rank, the cause
  int blamed_rank = -1; // the first rank behind, else the rank that waited longest
};

/// Hung when some rank has been blocked in a collective for at least timeout_s. ranks: one entry
/// per rank known (rank -1 entries are unreadable and count as "no progress reported");
/// world_size: ranks expected. Names the ranks that are behind and the likely cause: a rank that
/// never entered the collective (and whether it is busy, silent or gone), ranks inside different
/// collectives, mismatched dtypes/shapes, or every rank in the same collective.
HangVerdict analyze_hang(const std::vector<flight::Progress>& ranks, int world_size, double timeout_s);

/// After a rank failed: one line per rank known with where it is, plus a "likely cause" line when
/// the ranks' last collectives at the same position differ in op, dtype or shape (gloo aborts a
/// rank on such a mismatch). Empty when no rank has entered a collective.
std::string describe_positions(const std::vector<flight::Progress>& ranks);

/// One rank's line: "rank 0 (pid 41 on host): step 12 (last 0.2 s ago); waiting 3.0 s in #9
/// all_reduce float32[4] on world; last completed #8 ...", or where it stands when not waiting or
/// exited (the step part only when known).
std::string describe_rank(const flight::Progress& rank);

/// "12.3 s".
std::string format_seconds_text(double seconds);

}  // namespace lightning::fabric
