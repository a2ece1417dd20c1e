#include "lightning/fabric/utilities/process.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "lightning/fabric/errors.h"

extern char** environ;

namespace lightning::fabric {
namespace {

int open_pidfd(pid_t pid) {
  const long fd = syscall(SYS_pidfd_open, pid, 0);
  LF_CHECK(fd >= 0, RuntimeError, "pidfd_open(", pid, ") failed: ", std::strerror(errno),
           " (Linux 5.3 or newer is required).");
  return static_cast<int>(fd);
}

ExitStatus decode(int raw) {
  ExitStatus status;
  if (WIFSIGNALED(raw)) {
    status.signal = WTERMSIG(raw);
  } else {
    status.code = WEXITSTATUS(raw);
  }
  return status;
}

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// set_mempolicy's mode that prefers the nodes of its mask (the kernel's MPOL_PREFERRED).
constexpr int kPreferredMemoryPolicy = 1;

// What the child reports through its error pipe before it gives up: which step failed, and errno.
enum ChildStep : int { kExecStep = 0, kAffinityStep = 1 };
struct ChildFailure {
  int step = kExecStep;
  int error = 0;
};

// Everything the child needs, prepared before fork (only async-signal-safe calls after it).
struct ExecImage {
  std::vector<std::string> storage;
  std::vector<char*> argv;
  std::vector<char*> envp;
  cpu_set_t* cpus = nullptr;  // spec.cpu_affinity as a CPU set (CPU_ALLOC), nullptr: inherit
  size_t cpus_size = 0;
  std::vector<unsigned long> memory_nodes;  // spec.preferred_memory_node as a node mask; empty: none
  explicit ExecImage(const ProcessSpec& spec) {
    storage.reserve(spec.argv.size() + spec.env.size());
    for (const auto& arg : spec.argv) storage.push_back(arg);
    for (const auto& [key, value] : spec.env) storage.push_back(key + "=" + value);
    for (size_t i = 0; i < spec.argv.size(); ++i) argv.push_back(storage[i].data());
    argv.push_back(nullptr);
    for (size_t i = spec.argv.size(); i < storage.size(); ++i) envp.push_back(storage[i].data());
    envp.push_back(nullptr);
    if (!spec.cpu_affinity.empty()) {
      const int highest = *std::max_element(spec.cpu_affinity.begin(), spec.cpu_affinity.end());
      LF_CHECK(*std::min_element(spec.cpu_affinity.begin(), spec.cpu_affinity.end()) >= 0, ValueError,
               "ProcessSpec::cpu_affinity holds a negative CPU id (", cpu_list_text(spec.cpu_affinity), ").");
      cpus = CPU_ALLOC(highest + 1);
      LF_CHECK(cpus != nullptr, RuntimeError, "CPU_ALLOC(", highest + 1, ") failed: ", std::strerror(errno));
      cpus_size = CPU_ALLOC_SIZE(highest + 1);
      CPU_ZERO_S(cpus_size, cpus);
      for (int cpu : spec.cpu_affinity) CPU_SET_S(static_cast<size_t>(cpu), cpus_size, cpus);
    }
    if (spec.preferred_memory_node >= 0) {
      const size_t bits = sizeof(unsigned long) * 8, node = static_cast<size_t>(spec.preferred_memory_node);
      memory_nodes.assign(node / bits + 1, 0UL);
      memory_nodes[node / bits] |= 1UL << (node % bits);
    }
  }
  ~ExecImage() {
    if (cpus != nullptr) CPU_FREE(cpus);
  }
  ExecImage(const ExecImage&) = delete;
  ExecImage& operator=(const ExecImage&) = delete;
};

[[noreturn]] void exec_child(const ProcessSpec& spec, ExecImage& image, pid_t parent, int error_pipe) {
  setpgid(0, 0);
  if (spec.die_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
  }
  if (spec.guardian_pipe >= 0) {
    // Registered before the program runs: a parent killed right after fork still takes us along.
    const int32_t group = static_cast<int32_t>(getpid());
    (void)!write(spec.guardian_pipe, &group, sizeof(group));
  }
  if (image.cpus != nullptr && sched_setaffinity(0, image.cpus_size, image.cpus) != 0) {
    const ChildFailure failure{kAffinityStep, errno};
    (void)!write(error_pipe, &failure, sizeof(failure));
    _exit(127);
  }
  if (!image.memory_nodes.empty()) {
    // The raw system call: libnuma's set_mempolicy() wraps it, but its headers are not among the
    // project's dependencies. maxnode counts one more bit than the mask holds (the kernel drops
    // the last one, as libnuma passes it). Best effort: a container without CAP_SYS_NICE or a
    // kernel without NUMA refuses, and the CPU binding alone keeps the kernel's default local
    // allocation on the bound CPUs' node.
    (void)syscall(SYS_set_mempolicy, kPreferredMemoryPolicy, image.memory_nodes.data(),
                  static_cast<unsigned long>(image.memory_nodes.size() * sizeof(unsigned long) * 8 + 1));
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);  // the launcher blocks signals for its signalfd
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGCHLD}) signal(sig, SIG_DFL);
  if (spec.stdout_fd >= 0) dup2(spec.stdout_fd, STDOUT_FILENO);
  if (spec.stderr_fd >= 0) dup2(spec.stderr_fd, STDERR_FILENO);
  execve(spec.executable.c_str(), image.argv.data(), image.envp.data());
  const ChildFailure failure{kExecStep, errno};
  (void)!write(error_pipe, &failure, sizeof(failure));
  _exit(127);
}

// The guardian's body: reads process groups (int32) until the value 0 (release) or end of file
// (the owner died), then tears those groups down. Async-signal-safe calls only.
[[noreturn]] void guardian_main(int pipe_read, int64_t grace_ms) {
  setpgid(0, 0);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE}) signal(sig, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  const int null_fd = open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3; ++fd) dup2(null_fd, fd);
  static int32_t groups[8192];
  int count = 0;
  while (true) {
    int32_t value = 0;
    const ssize_t got = read(pipe_read, &value, sizeof(value));
    if (got < 0 && errno == EINTR) continue;
    if (got == static_cast<ssize_t>(sizeof(value))) {
      if (value == 0) _exit(0);  // released
      if (count < 8192) groups[count++] = value;
      continue;
    }
    break;  // end of file: the owner is gone
  }
  for (int i = 0; i < count; ++i) kill(-groups[i], SIGTERM);
  const timespec slice{0, 20 * 1000 * 1000};
  for (int64_t waited = 0; waited < grace_ms; waited += 20) {
    bool any = false;
    for (int i = 0; i < count && !any; ++i) any = kill(-groups[i], 0) == 0;
    if (!any) _exit(0);
    nanosleep(&slice, nullptr);
  }
  for (int i = 0; i < count; ++i) kill(-groups[i], SIGKILL);
  _exit(0);
}

}  // namespace

ProcessGuardian::ProcessGuardian(std::chrono::milliseconds grace) {
  int fds[2];
  LF_CHECK(pipe2(fds, O_CLOEXEC) == 0, RuntimeError, "pipe2 failed: ", std::strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw RuntimeError(std::string("fork (process guardian) failed: ") + std::strerror(errno));
  }
  if (pid == 0) {
    close(fds[1]);
    // Every other inherited file (worker output pipes, sockets) would be held open by the guardian.
    for (int fd = 3; fd < 1024; ++fd) {
      if (fd != fds[0]) close(fd);
    }
    guardian_main(fds[0], grace.count());
  }
  close(fds[0]);
  pid_ = pid;
  pipe_ = fds[1];
}

ProcessGuardian::~ProcessGuardian() { release(); }

void ProcessGuardian::release() {
  if (pipe_ < 0) return;
  const int32_t goodbye = 0;
  (void)!write(pipe_, &goodbye, sizeof(goodbye));
  close(pipe_);
  pipe_ = -1;
  int ignored = 0;
  waitpid(pid_, &ignored, 0);
}

std::string ExitStatus::describe() const {
  if (signal != 0) return "signal " + signal_name(signal) + " (" + std::to_string(signal) + ")";
  return "exit code " + std::to_string(code);
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

std::string signal_name(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

std::string cpu_list_text(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t last = i;
    while (last + 1 < cpus.size() && cpus[last + 1] == cpus[last] + 1) ++last;
    text += (text.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (last > i) text += "-" + std::to_string(cpus[last]);
    i = last + 1;
  }
  return text;
}

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text(*entry);
    const auto eq = text.find('=');
    if (eq != std::string::npos) env[text.substr(0, eq)] = text.substr(eq + 1);
  }
  return env;
}

std::string make_temporary_directory(const std::string& prefix) {
  // mkdtemp replaces the six trailing template characters with random ones.
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + std::string(6, 'X'))).string();
  LF_CHECK(mkdtemp(pattern.data()) != nullptr, RuntimeError, "Cannot create a temporary folder in ",
           std::filesystem::temp_directory_path().string(), ": ", std::strerror(errno));
  return pattern;
}

std::string resolve_executable(const std::string& name) {
  LF_CHECK(!name.empty(), ValueError, "No program to run was given.");
  if (name.find('/') != std::string::npos) {
    struct stat info {};
    LF_CHECK(::stat(name.c_str(), &info) == 0, ValueError, "Cannot run '", name, "': no such file.");
    LF_CHECK(S_ISREG(info.st_mode), ValueError, "Cannot run '", name, "': not a regular file.");
    LF_CHECK(::access(name.c_str(), X_OK) == 0, ValueError, "Cannot run '", name,
             "': not executable (chmod +x it).");
    return name;
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
  }
  throw ValueError("Cannot run '" + name + "': not found in PATH. Give a path such as ./" + name + ".");
}

ChildProcess ChildProcess::spawn(const ProcessSpec& spec) {
  ExecImage image(spec);
  int error_pipe[2];
  LF_CHECK(pipe2(error_pipe, O_CLOEXEC) == 0, RuntimeError, "pipe2 failed: ", std::strerror(errno));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    close(error_pipe[0]);
    exec_child(spec, image, parent, error_pipe[1]);
  }
  close(error_pipe[1]);
  if (pid < 0) {
    close(error_pipe[0]);
    throw RuntimeError(std::string("fork failed: ") + std::strerror(errno));
  }
  setpgid(pid, pid);  // also from the parent, so signal_group works even before the child runs
  ChildFailure failure;
  const ssize_t got = read(error_pipe[0], &failure, sizeof(failure));
  close(error_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof(failure))) {
    int raw = 0;
    waitpid(pid, &raw, 0);
    if (failure.step == kAffinityStep) {
      throw RuntimeError("Cannot bind '" + spec.executable + "' to CPUs " + cpu_list_text(spec.cpu_affinity) +
                         ": sched_setaffinity failed: " + std::strerror(failure.error) +
                         " (the CPUs this process may use are its Cpus_allowed_list in /proc/self/status).");
    }
    throw RuntimeError("Cannot run '" + spec.executable + "': " + std::strerror(failure.error));
  }
  return ChildProcess(pid, open_pidfd(pid));
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), pidfd_(std::exchange(other.pidfd_, -1)), status_(other.status_) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (pidfd_ >= 0) close(pidfd_);
    pid_ = std::exchange(other.pid_, -1);
    pidfd_ = std::exchange(other.pidfd_, -1);
    status_ = other.status_;
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (pidfd_ >= 0) close(pidfd_);
}

std::optional<ExitStatus> ChildProcess::try_reap() {
  if (status_) return status_;
  int raw = 0;
  const pid_t done = waitpid(pid_, &raw, WNOHANG);
  if (done == pid_) status_ = decode(raw);
  return status_;
}

ExitStatus ChildProcess::wait() {
  while (!status_) {
    int raw = 0;
    const pid_t done = waitpid(pid_, &raw, 0);
    if (done == pid_) status_ = decode(raw);
    if (done < 0 && errno != EINTR) status_ = ExitStatus{};  // already reaped elsewhere
  }
  return *status_;
}

void ChildProcess::signal_group(int signal) const {
  if (pid_ <= 0) return;
  if (killpg(pid_, signal) != 0 && status_ == std::nullopt) kill(pid_, signal);
}

std::optional<size_t> wait_any(std::vector<ChildProcess>& children, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::vector<pollfd> fds;
    std::vector<size_t> index;
    for (size_t i = 0; i < children.size(); ++i) {
      if (!children[i].running()) continue;
      fds.push_back({children[i].pidfd(), POLLIN, 0});
      index.push_back(i);
    }
    if (fds.empty()) return std::nullopt;
    int wait_ms = -1;
    if (timeout.count() >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      wait_ms = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    const int ready = poll(fds.data(), fds.size(), wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    for (size_t k = 0; k < fds.size(); ++k) {
      if ((fds[k].revents & POLLIN) != 0 && children[index[k]].try_reap()) return index[k];
    }
    if (ready <= 0 || (timeout.count() >= 0 && std::chrono::steady_clock::now() >= deadline)) return std::nullopt;
  }
}

void terminate_all(std::vector<ChildProcess>& children, int signal, std::chrono::milliseconds grace,
                   const std::function<void(std::chrono::milliseconds)>& idle) {
  // Exited workers' groups too: what they started and left behind gets the polite signal as well.
  for (auto& child : children) {
    if (child.running()) child.try_reap();
    child.signal_group(signal);
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  auto any_running = [&] {
    return std::any_of(children.begin(), children.end(),
                       [](const ChildProcess& c) { return c.running() || ::kill(-c.pid(), 0) == 0; });
  };
  while (any_running() && std::chrono::steady_clock::now() < deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (idle) {
      idle(std::min(left, std::chrono::milliseconds(20)));
      while (wait_any(children, std::chrono::milliseconds(0))) {
      }
    } else {
      wait_any(children, left);
    }
  }
  for (auto& child : children) {
    child.signal_group(SIGKILL);  // the worker if still running, and whatever it started
    child.wait();
  }
}

}  // namespace lightning::fabric
