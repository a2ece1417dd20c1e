// Helpers for tests that run lightning-run as a real process: start it with its output in
// files, wait with a deadline, send signals, find leftover processes by a marker variable.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric/utilities/process.h"

namespace lf_test {

/// A port the OS just reported free on 127.0.0.1.
int free_port();

/// Pids of live processes whose environment contains LF_TEST_MARKER=<marker>.
std::vector<int> processes_with_marker(const std::string& marker);

/// lightning-run (or any program) running with stdout/stderr captured in files. Each instance
/// gets a unique LF_TEST_MARKER that its workers inherit.
class Launched {
 public:
  Launched(const std::string& program, std::vector<std::string> args, std::map<std::string, std::string> extra_env = {},
           std::vector<std::string> prefix = {});
  ~Launched();

  /// Waits for the exit; returns the shell code, or nullopt (after killing it) past timeout.
  std::optional<int> wait(double timeout_s);
  /// Waits until stdout+stderr contain needle.
  bool wait_for_output(const std::string& needle, double timeout_s) const;
  void signal(int sig) const;
  std::string out() const;
  std::string err() const;
  std::string all() const { return out() + err(); }
  double seconds() const { return seconds_; }
  const std::string& marker() const { return marker_; }
  int pid() const { return child_->pid(); }

 private:
  std::string dir_;
  std::string marker_;
  std::optional<lightning::fabric::ChildProcess> child_;
  std::chrono::steady_clock::time_point start_;
  double seconds_ = 0;
};

/// Paths set by CMake.
std::string launcher_path();
std::string worker_path();
std::string program_path();

}  // namespace lf_test
