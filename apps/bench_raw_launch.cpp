// P4 baseline: start N copies of a worker with the torchrun environment set by hand — a TCPStore
// hosted here, fork + execve, waitpid — with none of lightning-run's rendezvous, supervision or
// output handling. Exits with the first non-zero worker status.
//   bench_raw_launch N WORKER [ARGS...]
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

extern char** environ;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: bench_raw_launch N WORKER [ARGS...]\n";
    return 2;
  }
  const int workers = std::atoi(argv[1]);
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  c10d::TCPStore store("127.0.0.1", options);
  const std::string port = std::to_string(store.getPort());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < workers; ++rank) {
    std::vector<std::string> vars;
    for (char** entry = environ; *entry != nullptr; ++entry) vars.emplace_back(*entry);
    const std::string r = std::to_string(rank), n = std::to_string(workers);
    for (const std::string& extra : {"RANK=" + r, "LOCAL_RANK=" + r, "WORLD_SIZE=" + n, "LOCAL_WORLD_SIZE=" + n,
                                     std::string("GROUP_RANK=0"), std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + port,
                                     std::string("TORCHELASTIC_RESTART_COUNT=0"),
                                     std::string("TORCHELASTIC_USE_AGENT_STORE=True")}) {
      vars.push_back(extra);
    }
    std::vector<char*> envp;
    for (auto& var : vars) envp.push_back(var.data());
    envp.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      execve(argv[2], argv + 2, envp.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  int result = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (result == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) result = 1;
  }
  return result;
}
