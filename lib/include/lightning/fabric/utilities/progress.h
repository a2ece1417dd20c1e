// A progress bar for long loops, shown by one process (pass enabled = fabric.is_global_zero()):
// on a terminal one line redrawn in place (at most 10 times a second) with the count, percentage,
// elapsed time, ETA, rate and the latest loss; when the output is not a terminal (a log file, a
// pipe) a plain line every `plain_interval_s` seconds and at the end. It writes to stderr by
// default, like tqdm, so that a program's stdout stays for its results. Under lightning-run on a
// terminal (LT_TERMINAL=1) it redraws too: the launcher forwards the redraws, tagged.
//   lf::ProgressBar bar("epoch 1", loader.size(), fabric.is_global_zero());
//   for (auto& batch : loader) { ...; bar.update(1, loss.item<double>()); }
//   bar.close();
#pragma once

#include "lightning/fabric/export.h"

#include <cstdint>
#include <functional>
#include <iostream>
#include <optional>
#include <string>

namespace lightning::fabric {

struct LF_API ProgressBarOptions {
  std::optional<bool> terminal;  // default: the stream is stdout/stderr on a terminal, or LT_TERMINAL=1
  double plain_interval_s = 10.0;
  std::function<double()> clock;  // seconds; default a steady clock (tests pass their own)
};

class LF_API ProgressBar {
 public:
  ProgressBar(std::string description, std::optional<int64_t> total, bool enabled = true, std::ostream& out = std::cerr,
              ProgressBarOptions options = ProgressBarOptions());
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// Advances by n steps; loss (when given) is shown until the next one.
  void update(int64_t n = 1, std::optional<double> loss = std::nullopt);
  /// Draws the final state and ends the line; called by the destructor if not before.
  void close();
  /// The text of the current state (without terminal control characters).
  std::string line() const;

 private:
  void draw(bool final);

  std::string description_;
  std::optional<int64_t> total_;
  bool enabled_;
  std::ostream& out_;
  ProgressBarOptions options_;
  bool terminal_;
  double start_ = 0, last_draw_ = -1e9;
  int64_t count_ = 0;
  std::optional<double> loss_;
  bool closed_ = false;
};

}  // namespace lightning::fabric
