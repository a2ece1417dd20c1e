#include "lightning/fabric/internal/step_times.h"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace lightning::fabric::internal {

namespace {
constexpr size_t kKept = 100000;

double percentile(std::vector<double> sorted_values, double q) {
  std::sort(sorted_values.begin(), sorted_values.end());
  const auto index = static_cast<size_t>(q * static_cast<double>(sorted_values.size() - 1) + 0.5);
  return sorted_values[std::min(index, sorted_values.size() - 1)];
}
}  // namespace

std::string StepTimeSummary::serialize() const {
  std::ostringstream text;
  text << intervals << " " << p50_ms << " " << p90_ms << " " << p99_ms << " " << max_ms << "\n";
  return text.str();
}

std::optional<StepTimeSummary> StepTimeSummary::parse(const std::string& text) {
  StepTimeSummary summary;
  std::istringstream in(text);
  if (!(in >> summary.intervals >> summary.p50_ms >> summary.p90_ms >> summary.p99_ms >> summary.max_ms)) return std::nullopt;
  if (summary.intervals < 1) return std::nullopt;
  return summary;
}

void StepTimes::after_optimizer_step() {
  const auto now = std::chrono::steady_clock::now();
  if (last_) {
    const double ms = std::chrono::duration<double, std::milli>(now - *last_).count();
    if (intervals_ms_.size() < kKept) {
      intervals_ms_.push_back(ms);
    } else {
      intervals_ms_[next_] = ms;
      next_ = (next_ + 1) % kKept;
    }
    ++total_;
  }
  last_ = now;
}

StepTimeSummary StepTimes::summary() const {
  StepTimeSummary summary;
  summary.intervals = total_;
  if (intervals_ms_.empty()) return summary;
  summary.p50_ms = percentile(intervals_ms_, 0.50);
  summary.p90_ms = percentile(intervals_ms_, 0.90);
  summary.p99_ms = percentile(intervals_ms_, 0.99);
  summary.max_ms = *std::max_element(intervals_ms_.begin(), intervals_ms_.end());
  return summary;
}

StepTimes::~StepTimes() {
  if (total_ == 0) return;
  std::ofstream out(file_);
  out << summary().serialize();
  if (!out) std::cerr << "lightning-fabric: could not write the step times to " << file_ << std::endl;
}

std::string describe_step_times(const std::vector<std::string>& files, int first_rank) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(2);
  bool any = false;
  for (size_t i = 0; i < files.size(); ++i) {
    std::ifstream in(files[i]);
    std::stringstream contents;
    contents << in.rdbuf();
    const auto summary = StepTimeSummary::parse(contents.str());
    if (!summary) continue;
    text << (any ? "; " : "") << "rank " << first_rank + static_cast<int>(i) << ": p50 " << summary->p50_ms
         << " ms, p90 " << summary->p90_ms << " ms, p99 " << summary->p99_ms << " ms, max " << summary->max_ms
         << " ms over " << summary->intervals << " steps";
    any = true;
  }
  return any ? text.str() : std::string();
}

}  // namespace lightning::fabric::internal
