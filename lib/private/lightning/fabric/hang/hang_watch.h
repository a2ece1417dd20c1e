// lightning-run's view of its node's ranks: it maps every local rank's flight recorder
// (<attempt dir>/rank_<R>.flight, written by the ranks because LT_FLIGHT_DIR points there). On one
// node it judges hangs with analyze_hang and the ranks' own hang timeout, and on a hang has every
// rank dump its recorder and native stack into <attempt dir>/hang/ (writing from the shared memory
// itself for a rank that does not answer) next to report.txt; jobs across nodes are judged by the
// ranks through the store instead (hang_watchdog.h). On every node it answers `lightning-run
// status`: each rank's step, collectives and native stack, while the job goes on.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric/hang/flight_recorder.h"
#include "lightning/fabric/hang/hang_report.h"
#include "lightning/fabric/hang/straggler.h"

namespace lightning::fabric {

class HangWatch {
 public:
  /// attempt_dir holds the recorder files; ranks rank_offset .. rank_offset + local_count - 1.
  HangWatch(std::string attempt_dir, int rank_offset, int local_count, int world_size);

  /// Reads every recorder that exists yet. exited[i]: how local worker i ended ("" while it runs).
  /// A verdict when the job hangs (judged with the ranks' hang timeout; none while it is 0).
  std::optional<fabric::HangVerdict> check(const std::vector<std::string>& exited);

  /// Asks every rank to dump, waits up to `wait` for them (calling idle(slice) meanwhile), writes
  /// the recorders of ranks that did not answer and report.txt; returns the report with the
  /// folder's path and the files.
  std::string dump(const fabric::HangVerdict& verdict, std::chrono::milliseconds wait,
                   const std::function<void(std::chrono::milliseconds)>& idle);

  /// After a local worker failed: where every rank was (describe_positions); empty without recorders.
  std::string positions(const std::vector<std::string>& exited);

  /// The rank that holds the job back now (find_straggler over every rank's recorder, with the
  /// threshold rank 0 wrote in its recorder), with the message naming it, this host and the
  /// threshold; nullopt without one, with the threshold 0, or before every rank has a recorder.
  std::optional<std::pair<StragglerVerdict, std::string>> straggler();

  /// Asks every local rank with a recorder, a watchdog (hang timeout > 0) and no exit yet (exited
  /// as in check) to write its dump files into dir (its watchdog answers within 200 ms; the rank
  /// goes on). Returns the requests, by local rank (0: not asked).
  std::vector<uint32_t> request_dumps(const std::string& dir, const std::vector<std::string>& exited);
  /// Whether every rank asked has answered its request or exited since (exited as in check).
  bool dumps_answered(const std::vector<uint32_t>& requests, const std::vector<std::string>& exited) const;
  /// The status view of this node's ranks: for each local rank its line (describe_rank) and the
  /// native stack it wrote into dir for `requests`, or why there is none.
  std::string status(const std::vector<std::string>& exited, const std::string& dir,
                     const std::vector<uint32_t>& requests);

  /// Milliseconds between checks (a fraction of the hang timeout, 50 ms to 1 s).
  int period_ms() const;

 private:
  std::string attempt_dir_;
  int rank_offset_;
  int world_size_;
  std::vector<fabric::flight::Progress> read(const std::vector<std::string>& exited);
  std::vector<std::unique_ptr<fabric::flight::Recorder>> recorders_;  // by local rank; null until the file exists
  int64_t timeout_ms_ = 0;
};

}  // namespace lightning::fabric
