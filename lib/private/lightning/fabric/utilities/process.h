// Child processes for the launcher and for Fabric::launch(): spawning with the environment
// contract, each worker in its own process group and killed if its parent dies, exit notification
// through pidfds (no polling loops), and bounded teardown (polite signal, grace, SIGKILL, reap).
// One implementation serves both lightning-run and Fabric::launch().
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lightning::fabric {

/// How a process ended.
struct ExitStatus {
  int code = 0;      // exit code, when exited normally
  int signal = 0;    // terminating signal, when killed
  bool success() const { return signal == 0 && code == 0; }
  /// The shell's convention: the exit code, or 128 + signal.
  int shell_code() const { return signal != 0 ? 128 + signal : code; }
  /// "exit code 3" or "signal SIGSEGV (11)".
  std::string describe() const;
};

/// "SIGSEGV" for 11, "signal 64" for an unnamed one.
std::string signal_name(int signal);

/// This machine's host name (gethostname; empty if it fails).
std::string host_name();

/// What to start.
struct ProcessSpec {
  std::string executable;                       // absolute or relative path (see resolve_executable)
  std::vector<std::string> argv;                // argv[0] included
  std::map<std::string, std::string> env;       // the whole environment of the child
  int stdout_fd = -1;                           // -1: inherit the parent's
  int stderr_fd = -1;
  bool die_with_parent = true;                  // PR_SET_PDEATHSIG(SIGKILL), bound to the spawning thread
  int guardian_pipe = -1;                       // ProcessGuardian::pipe(): the child registers its own
                                                // group before exec, so no worker ever runs unwatched
  std::vector<int> cpu_affinity;                // non-empty: the child runs on these CPUs only
                                                // (sched_setaffinity before exec; lightning-run --numa-binding)
  int preferred_memory_node = -1;               // >= 0: the child's memory policy prefers this NUMA node
                                                // (set_mempolicy MPOL_PREFERRED before exec; best effort:
                                                // where the kernel or a sandbox refuses, the default stays)
};

/// "0-3,8,10-11" for {0, 1, 2, 3, 8, 10, 11} (the sysfs form; any order, duplicates allowed); "" for none.
std::string cpu_list_text(std::vector<int> cpus);

/// The current process environment as a map.
std::map<std::string, std::string> current_environment();

/// Creates a new private directory under the system's temporary folder, named prefix + random
/// characters; throws RuntimeError naming the folder on failure. The caller removes it.
std::string make_temporary_directory(const std::string& prefix);

/// Finds `name` as execvp would: a path with '/' must be an executable file; otherwise PATH is
/// searched. Throws ValueError naming the binary and why it cannot run.
std::string resolve_executable(const std::string& name);

/// A started child. Owns its pidfd; reaps the child on wait.
class ChildProcess {
 public:
  /// fork + exec in a new process group. Throws RuntimeError if exec fails (with errno's text), or
  /// if the child cannot take spec.cpu_affinity (naming the CPUs).
  static ChildProcess spawn(const ProcessSpec& spec);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  /// Readable (POLLIN) once the child has exited.
  int pidfd() const { return pidfd_; }
  bool running() const { return !status_.has_value(); }
  const std::optional<ExitStatus>& status() const { return status_; }
  /// Reaps the child if it has exited (non-blocking); returns its status then.
  std::optional<ExitStatus> try_reap();
  /// Blocks until the child exits, reaps it and returns its status.
  ExitStatus wait();
  /// Sends signal to the child's whole process group (its own children included).
  void signal_group(int signal) const;

 private:
  ChildProcess(pid_t pid, int pidfd) : pid_(pid), pidfd_(pidfd) {}
  pid_t pid_ = -1;
  int pidfd_ = -1;
  std::optional<ExitStatus> status_;
};

/// Whole-tree teardown that survives its owner: a small process forked at construction that
/// outlives the owner (the launcher, or rank 0 under Fabric::launch). Each worker spawned with
/// ProcessSpec::guardian_pipe = pipe() tells it its process group before exec; if the owner dies without release() (SIGKILL, SIGSEGV, ...),
/// the guardian sees its pipe close at once and sends SIGTERM to every watched group, then SIGKILL
/// to what is left after `grace`, so workers and all their descendants go with the owner. A
/// descendant that left its worker's process group on purpose (setsid, setpgid) is not followed.
/// The guardian is in its own process group, ignores SIGINT/SIGTERM/SIGHUP, and holds no other
/// file of its owner (stdin/stdout/stderr go to /dev/null). Construct it before starting threads
/// when possible; after fork it runs only async-signal-safe code either way.
class ProcessGuardian {
 public:
  explicit ProcessGuardian(std::chrono::milliseconds grace = std::chrono::milliseconds(1000));
  ~ProcessGuardian();  // release()
  ProcessGuardian(const ProcessGuardian&) = delete;
  ProcessGuardian& operator=(const ProcessGuardian&) = delete;

  /// For ProcessSpec::guardian_pipe: a child given it registers its own process group between fork
  /// and exec, so the guardian knows it before the child's program runs.
  int pipe() const { return pipe_; }
  /// Normal end: the guardian exits without touching anything.
  void release();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int pipe_ = -1;  // write end, close-on-exec
};

/// Waits until one of the running children exits or timeout passes; returns its index.
/// timeout < 0 waits forever. Children already reaped are skipped.
std::optional<size_t> wait_any(std::vector<ChildProcess>& children, std::chrono::milliseconds timeout);

/// Stops every child: `signal` to each process group (of exited children too, for what they left
/// behind), up to `grace` for the children and their groups to be gone, then SIGKILL to every
/// group and reap. Afterwards no child or member of their groups is left. While waiting,
/// `idle(slice)` is called instead of sleeping (the launcher reads worker output there).
void terminate_all(std::vector<ChildProcess>& children, int signal, std::chrono::milliseconds grace,
                   const std::function<void(std::chrono::milliseconds)>& idle = nullptr);

}  // namespace lightning::fabric
