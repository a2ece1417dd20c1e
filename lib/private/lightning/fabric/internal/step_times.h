// Step times for lightning-run's end-of-job summary: under lightning-run (LT_STEP_TIMES_DIR set)
// every rank times the intervals between its optimizer steps and, when its Fabric is destroyed,
// writes their percentiles to <dir>/rank_<R>.steps; lightning-run reads its node's files once the
// attempt ends and prints one line.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric/utilities/profiler.h"

namespace lightning::fabric::internal {

struct StepTimeSummary {
  int64_t intervals = 0;  // between consecutive optimizer steps (the last 100,000 kept)
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, max_ms = 0;
  std::string serialize() const;                          // one line: "intervals p50 p90 p99 max"
  static std::optional<StepTimeSummary> parse(const std::string& text);
};

/// Times the intervals between optimizer steps; writes the summary to `file` when destroyed
/// (nothing with fewer than one interval).
class StepTimes : public StepObserver {
 public:
  explicit StepTimes(std::string file) : file_(std::move(file)) {}
  ~StepTimes() override;
  void after_optimizer_step() override;
  StepTimeSummary summary() const;

 private:
  std::string file_;
  std::optional<std::chrono::steady_clock::time_point> last_;
  std::vector<double> intervals_ms_;  // a ring of the most recent kKept
  size_t next_ = 0;
  int64_t total_ = 0;
};

/// Tells several observers of each step (FabricOptimizer holds one).
class StepObservers : public StepObserver {
 public:
  explicit StepObservers(std::vector<std::shared_ptr<StepObserver>> observers) : observers_(std::move(observers)) {}
  void after_optimizer_step() override {
    for (const auto& observer : observers_) observer->after_optimizer_step();
  }

 private:
  std::vector<std::shared_ptr<StepObserver>> observers_;
};

/// "rank 0: p50 7.12 ms, p90 7.40 ms, p99 8.01 ms, max 9.52 ms over 299 steps" per rank with a file,
/// joined by "; "; empty when no rank wrote one. files[i] is rank first_rank + i's.
std::string describe_step_times(const std::vector<std::string>& files, int first_rank);

}  // namespace lightning::fabric::internal
