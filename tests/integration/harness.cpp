#include "harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace lf_test {

std::string launcher_path() { return LF_TEST_LAUNCHER; }
std::string worker_path() { return LF_TEST_WORKER; }
std::string program_path() { return LF_TEST_PROGRAM; }

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

std::vector<int> processes_with_marker(const std::string& marker) {
  std::vector<int> pids;
  const std::string needle = "LF_TEST_MARKER=" + marker;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream environ(entry.path() / "environ", std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(environ)), std::istreambuf_iterator<char>());
    std::ifstream stat(entry.path() / "stat");
    std::string stat_line;
    std::getline(stat, stat_line);
    const auto state_at = stat_line.rfind(')');
    if (state_at != std::string::npos && stat_line.size() > state_at + 2 && stat_line[state_at + 2] == 'Z') continue;
    if (content.find(needle + '\0') != std::string::npos || content.size() >= needle.size() &&
        content.compare(content.size() - needle.size(), needle.size(), needle) == 0) {
      pids.push_back(std::stoi(name));
    }
  }
  return pids;
}

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
std::atomic<int> counter{0};
}  // namespace

Launched::Launched(const std::string& program, std::vector<std::string> args, std::map<std::string, std::string> extra_env,
                   std::vector<std::string> prefix) {
  marker_ = std::to_string(getpid()) + "-" + std::to_string(counter++);
  dir_ = (std::filesystem::temp_directory_path() / ("lf-test-" + marker_)).string();
  std::filesystem::create_directories(dir_);
  const int out = open((dir_ + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = open((dir_ + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  lightning::fabric::ProcessSpec spec;
  spec.argv = prefix;
  spec.argv.push_back(program);
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.executable = lightning::fabric::resolve_executable(spec.argv.front());
  spec.env = lightning::fabric::current_environment();
  spec.env["LF_TEST_MARKER"] = marker_;
  for (const auto& [key, value] : extra_env) spec.env[key] = value;
  spec.stdout_fd = out;
  spec.stderr_fd = err;
  start_ = std::chrono::steady_clock::now();
  child_.emplace(lightning::fabric::ChildProcess::spawn(spec));
  close(out);
  close(err);
}

Launched::~Launched() {
  if (child_ && child_->running()) {
    child_->signal_group(SIGKILL);
    child_->wait();
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::optional<int> Launched::wait(double timeout_s) {
  std::vector<lightning::fabric::ChildProcess> one;
  one.push_back(std::move(*child_));
  auto done = lightning::fabric::wait_any(one, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  child_.emplace(std::move(one.front()));
  seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (!done) {
    child_->signal_group(SIGKILL);
    child_->wait();
    return std::nullopt;
  }
  return child_->status()->shell_code();
}

bool Launched::wait_for_output(const std::string& needle, double timeout_s) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    if (all().find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

void Launched::signal(int sig) const { kill(child_->pid(), sig); }
std::string Launched::out() const { return read_all(dir_ + "/out"); }
std::string Launched::err() const { return read_all(dir_ + "/err"); }

}  // namespace lf_test
