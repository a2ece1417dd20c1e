// Worker output: each worker's stdout and stderr arrive through pipes; lines are tagged with the
// global rank (and a timestamp on request), copied to the console (for the ranks in the filter)
// and to per-rank log files, and the last lines of each worker are kept for the failure report.
// A carriage return ends a transient line (a progress bar redrawing itself): it reaches the console
// at once, tagged, and is overwritten by the next one; logs and the failure report keep only
// complete lines. Any other console line first clears a transient line on screen.
#pragma once

#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace lightning::launcher {

struct OutputOptions {
  bool tag = false;
  bool timestamp = false;
  std::optional<std::set<int>> console_local_ranks;  // nullopt: every rank reaches the console
  std::optional<std::string> log_dir;                // <log_dir>/attempt_<N>/rank_<R>.{stdout,stderr}
  size_t tail_lines = 20;
};

class OutputRouter {
 public:
  explicit OutputRouter(OutputOptions options) : options_(std::move(options)) {}
  ~OutputRouter();
  OutputRouter(const OutputRouter&) = delete;
  OutputRouter& operator=(const OutputRouter&) = delete;

  /// Opens the two pipes of one worker; returns the write ends {stdout, stderr} for the child
  /// (the caller closes them after spawning).
  std::pair<int, int> open_worker(int global_rank, int local_rank, int attempt);
  /// Read ends still open.
  std::vector<int> fds() const;
  /// Reads what is available on fd; closes it at end of file.
  void on_readable(int fd);
  /// Reads every pipe until end of file or until wait_ms passes without data.
  void drain(int wait_ms);
  /// The last lines (stdout and stderr interleaved as they arrived) of a worker.
  std::vector<std::string> tail(int global_rank) const;
  /// Closes every stream (before a restart); the tails stay for a later failure report.
  void reset();

 private:
  struct Stream {
    int global_rank = 0;
    int local_rank = 0;
    bool is_stderr = false;
    std::string partial;
    bool redrawing = false;      // the last line ended with '\r': the pending text is transient
    std::string last_transient;  // the latest transient text (a "\r\n" split across reads ends it)
    std::FILE* log = nullptr;
  };
  void emit(Stream& stream, const std::string& line, bool complete);
  void show_transient(Stream& stream, const std::string& text);
  void write_console(int fd, const std::string& text, bool transient);
  void close_stream(int fd);

  OutputOptions options_;
  std::map<int, Stream> streams_;  // by read fd
  std::map<int, std::deque<std::string>> tails_;
  bool transient_on_screen_ = false;
};

}  // namespace lightning::launcher
