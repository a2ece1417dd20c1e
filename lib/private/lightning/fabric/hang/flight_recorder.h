// The flight recorder: each rank notes every collective it issues (a sequence number, the op, the
// group, dtype and shape, when it entered and when it left) in a ring of the last N records, and
// keeps a small header with its progress: the last collective entered and completed, the one it
// is waiting in and since when, and a heartbeat from its watchdog thread. The hang watchdog (in
// the ranks) and lightning-run (reading the same memory as a file) use it to tell which rank is
// behind and where (docs/launcher.md, "When a job hangs").
//
// Memory: one recorder per process, created by the first process group (Collective). When
// LT_FLIGHT_DIR is set (lightning-run sets it on one node), the recorder is a shared file
// <dir>/rank_<R>.flight that the rank writes and the launcher maps to read and to request dumps;
// otherwise it is private memory. Cost per collective: one record written (about 300 bytes) and a
// few atomic stores, no system call.
//
// Threads: begin/wait/end are called by the thread that issues a collective (one at a time, as
// collectives are); progress() and dump_text() may run on any thread or in another process and
// read without locks (a record being rewritten may read torn; the seq check drops it).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lightning::fabric::flight {

/// One collective. Strings are NUL-terminated and cut to fit.
struct Record {
  uint64_t seq = 0;          // 1, 2, ... in issue order on this rank; 0 = empty slot
  int64_t enter_ns = 0;      // CLOCK_MONOTONIC
  int64_t leave_ns = 0;      // 0 while in flight
  uint64_t numel = 0;
  uint32_t state = 0;        // 0 in flight, 1 done, 2 failed (threw)
  char op[28] = {};
  char group[32] = {};
  char dtype[16] = {};
  char shape[96] = {};
};

/// The shared header, layout version 2 (this declaration is its description: lightning-run and the
/// ranks it maps come from one build, and attach() refuses another version).
struct Header {
  char magic[8] = {};               // "LFFLIGHT"
  uint32_t version = 0;
  uint32_t capacity = 0;            // records in the ring after the header
  int32_t rank = -1;
  int32_t world_size = 0;
  int32_t pid = 0;
  int32_t straggler_threshold_us = 0;  // the rank's effective straggler threshold (the launcher judges with it)
  int64_t start_mono_ns = 0;        // CLOCK_MONOTONIC and CLOCK_REALTIME at creation, to print wall times
  int64_t start_wall_ns = 0;
  int64_t hang_timeout_ms = 0;      // the rank's effective hang timeout (the launcher judges with it)
  std::atomic<uint64_t> entered{0};          // seq of the last collective entered
  std::atomic<uint64_t> completed{0};        // seq of the last collective that finished
  std::atomic<uint64_t> waiting_seq{0};      // seq this rank is blocked in; 0 = not blocked
  std::atomic<int64_t> waiting_since_ns{0};
  std::atomic<int64_t> last_leave_ns{0};     // when the last collective finished (0: none yet)
  std::atomic<int64_t> heartbeat_ns{0};      // the watchdog thread's last beat
  std::atomic<int32_t> issuing_tid{0};       // thread that issued the last collective (for stacks)
  std::atomic<uint32_t> dump_request{0};     // a watcher's request count; the rank's watchdog dumps for each new one
  std::atomic<uint32_t> dump_done{0};        // the request the rank last answered (its dump files are written)
  char dump_dir[512] = {};                   // where to dump; written before dump_request
  std::atomic<int64_t> steps{0};             // optimizer steps taken (every set-up optimizer's step counts)
  std::atomic<int64_t> last_step_ns{0};      // when the last one was taken (0: none yet)
};

/// A collective as the analysis compares it across ranks.
struct Call {
  uint64_t seq = 0;
  std::string op, group, dtype, shape;
  bool done = false;         // finished (or failed)
  bool failed = false;       // threw (a timeout, a lost peer)
  /// "#12 all_reduce float32[4, 8] on world"; "#13 barrier on world".
  std::string describe() const;
  bool same_signature(const Call& other) const { return op == other.op && dtype == other.dtype && shape == other.shape; }
};

/// A rank's progress: read from a recorder (here or in a file) or from the store.
struct Progress {
  int rank = -1;
  int pid = 0;
  std::string host;
  Call entered;              // the last collective entered (seq 0: none yet)
  Call completed;            // the last collective that finished
  bool waiting = false;      // blocked inside `entered`-or-earlier collective waiting_call
  Call waiting_call;
  double waiting_s = 0;      // how long it has been blocked
  double idle_s = 0;         // not waiting: time since its last collective ended (or since start)
  double silent_s = 0;       // since its watchdog's last heartbeat (a frozen or dead rank grows this)
  std::string exited;        // set by a launcher when the process has ended: "exit code 0", ...
  int64_t steps = -1;        // optimizer steps taken (-1: not known)
  double since_step_s = 0;   // since the last one (or since start, with none yet)

  std::string serialize() const;
  static Progress parse(const std::string& text);
};

int64_t monotonic_ns();

/// How Recorder::entries times each collective's entry so that ranks can be compared:
///   kMonotonic: its CLOCK_MONOTONIC entry time, comparable between ranks of one machine;
///   kFromLeave: minus its wait (leave - enter), its entry time counted back from the moment it
///     left. Every rank leaves a collective at about the same moment, so these compare across
///     machines without synchronised clocks.
enum class EntryTimes { kMonotonic, kFromLeave };

class Recorder {
 public:
  /// A new recorder for this rank: in `file` (created, mode 0600) when not empty, else in private
  /// memory. Throws RuntimeError naming the file when it cannot be created.
  static std::unique_ptr<Recorder> create(int rank, int world_size, uint32_t capacity, const std::string& file);
  /// Maps another process's recorder file (lightning-run); nullopt-like null when it is missing,
  /// short or not a recorder.
  static std::unique_ptr<Recorder> attach(const std::string& file);

  /// The process's recorder (set by install(); null when none: world size 1 or recording off).
  static Recorder* process();
  /// Makes `recorder` the process's one (the first install wins; later ones are ignored).
  static Recorder* install(std::unique_ptr<Recorder> recorder);

  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// A collective is issued: returns its seq. sizes/dims: the tensor's shape.
  uint64_t begin(const char* op, const std::string& group, const char* dtype, const int64_t* sizes, size_t dims,
                 uint64_t numel);
  /// The issuing thread blocks until `seq` completes.
  void wait(uint64_t seq);
  /// `seq` completed (failed: it threw).
  void end(uint64_t seq, bool failed);
  void heartbeat();
  /// An optimizer step was taken (FabricOptimizer, every strategy; skipped and replayed steps too).
  void note_step();
  /// A watcher asks the rank to write its dump files into dir (the watchdog answers within a
  /// period); returns the request's number, which dump_answered then reports.
  uint32_t request_dump(const std::string& dir);
  /// Whether the rank has answered `request` (or a later one).
  bool dump_answered(uint32_t request) const;

  Header& header() { return *header_; }
  const Header& header() const { return *header_; }
  /// This rank's progress now (silent_s from the heartbeat).
  Progress progress() const;
  /// The ring as text, oldest first: one line per record with times relative to now and wall
  /// clock times (the format is in docs/launcher.md).
  std::string dump_text() const;
  /// The record with this seq, if the ring still holds it.
  std::optional<Call> call(uint64_t seq) const;
  /// When this rank entered each of its last `count` completed collectives: (seq, entry time in ns
  /// as `times` says), newest first, as far as the ring still holds them.
  std::vector<std::pair<uint64_t, int64_t>> entries(size_t count, EntryTimes times = EntryTimes::kMonotonic) const;

 private:
  Recorder() = default;
  Header* header_ = nullptr;
  Record* records_ = nullptr;
  size_t bytes_ = 0;
  bool mapped_ = false;
};

/// RAII for one blocking collective: begin + wait in the constructor, end in the destructor (failed
/// when unwinding). A null recorder makes it a no-op.
class Scope {
 public:
  Scope(Recorder* recorder, const char* op, const std::string& group, const char* dtype, const int64_t* sizes,
        size_t dims, uint64_t numel);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  /// The collective's seq (0 without a recorder).
  uint64_t seq() const { return seq_; }

 private:
  Recorder* recorder_;
  uint64_t seq_ = 0;
  int uncaught_ = 0;
};

}  // namespace lightning::fabric::flight
