// Simulated ranks against one TCPStore: the rendezvous, the steady-state hang watch and a hang's
// report at scale.
//   bench_store_scale RANKS [STEADY_SECONDS] [--nodes N] [--hang-timeout SECONDS] [--period-ms MS] [--no-entries]
// A child process hosts the store (as lightning-run's node 0, torchrun's agent or rank 0 do).
// Without --nodes, one process runs RANKS threads as ranks, each with a store connection of its own
// (what workers do without a relay). With --nodes N, N processes act as nodes: each holds a store
// relay (one connection to the store, as a node's lightning-run does) and RANKS/N threads as its
// ranks, which reach the store through it. The ranks run the library's own rendezvous
// (connect_store, await_all_ranks, the same-host vote), then publish their progress every period
// (default: the watchdog's, store_watch_period with the default 300 s hang timeout) for
// STEADY_SECONDS (default 10) through StoreWatch, rank 0 also reading every rank back, as the hang
// watchdog does. Then every rank but the last enters a collective the last never joins: rank 0
// judges each period (analyze_hang with --hang-timeout, default 30 s) and the time from the hang's
// start to its report is measured. Prints one JSON object.
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "lightning/fabric/hang/flight_recorder.h"
#include "lightning/fabric/hang/hang_report.h"
#include "lightning/fabric/hang/store_watch.h"
#include "lightning/fabric/hang/straggler.h"
#include "lightning/fabric/internal/store_relay.h"
#include "lightning/fabric/plugins/collectives/collective_rendezvous.h"

namespace lf = lightning::fabric;
using Clock = std::chrono::steady_clock;

namespace {
// A PrefixStore that counts the requests a rank sends.
class CountingStore : public c10d::PrefixStore {
 public:
  CountingStore(const std::string& prefix, c10::intrusive_ptr<c10d::Store> base, std::atomic<int64_t>& count)
      : c10d::PrefixStore(prefix, std::move(base)), count_(count) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override { ++count_, PrefixStore::set(key, value); }
  std::vector<uint8_t> get(const std::string& key) override { return ++count_, PrefixStore::get(key); }
  int64_t add(const std::string& key, int64_t value) override { return ++count_, PrefixStore::add(key, value); }
  bool check(const std::vector<std::string>& keys) override { return ++count_, PrefixStore::check(keys); }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    return ++count_, PrefixStore::multiGet(keys);
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override {
    ++count_, PrefixStore::multiSet(keys, values);
  }
  void wait(const std::vector<std::string>& keys) override { ++count_, PrefixStore::wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    ++count_, PrefixStore::wait(keys, timeout);
  }

 private:
  std::atomic<int64_t>& count_;
};

double thread_cpu_s() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

double process_cpu_s(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string field;
  for (int i = 0; i < 13; ++i) stat >> field;  // utime and stime are fields 14 and 15
  double user = 0, system = 0;
  stat >> user >> system;
  return (user + system) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// steady_clock is CLOCK_MONOTONIC: its time points compare across this machine's processes.
int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }
Clock::time_point at_ns(int64_t ns) { return Clock::time_point(std::chrono::nanoseconds(ns)); }
double seconds_between(int64_t from_ns, int64_t to_ns) { return static_cast<double>(to_ns - from_ns) * 1e-9; }

// The child: hosts the store on a free port, writes the port to `report`, lives until `hold` closes.
pid_t start_store(int& port) {
  int report[2], hold[2];
  if (pipe(report) != 0 || pipe(hold) != 0) throw std::runtime_error("pipe failed");
  const pid_t child = fork();
  if (child == 0) {
    close(report[0]);
    close(hold[1]);
    c10d::TCPStoreOptions options;
    options.isServer = true;
    options.waitWorkers = false;
    options.port = 0;
    c10d::TCPStore store("127.0.0.1", options);
    const int chosen = store.getPort();
    if (write(report[1], &chosen, sizeof(chosen)) != sizeof(chosen)) _exit(1);
    char byte = 0;
    while (read(hold[0], &byte, 1) > 0) {
    }
    _exit(0);
  }
  close(report[1]);
  close(hold[0]);
  if (read(report[0], &port, sizeof(port)) != sizeof(port)) throw std::runtime_error("the store process did not start");
  close(report[0]);
  static int keep_open = -1;
  keep_open = hold[1];  // closed when this process exits, which ends the store
  return child;
}

struct Plan {
  int ranks = 0;
  int nodes = 0;  // 0: no relay, one process of ranks
  double steady_s = 10;
  std::chrono::milliseconds period{1000};
  double hang_timeout_s = 30;
  bool entries = true;  // publish straggler entries (the watchdog does when stragglers are watched, the default)
  int port = 0;
  int64_t start_ns = 0;
};

// What a node process sends back, one line per phase.
struct RendezvousLine {
  int64_t connected_ns = 0;  // the last of its ranks has its store connection
  int64_t arrived_ns = 0;    // ... has seen every rank arrive (await_all_ranks)
  int64_t done_ns = 0;       // ... has its host layout (the vote)
  int64_t store_requests = 0;  // the requests the main store received from this node so far
};
struct SteadyLine {
  int64_t store_requests = 0;  // during the steady window
  int64_t worker_requests = 0;
  double node_cpu_s = 0;       // the node process (relay and ranks) during the steady window
  double rank0_cpu_s = -1;     // rank 0's thread, on its node
  double hang_reported_s = -1; // rank 0's node: from the hang's start to its report (-1: none)
};

// 64 entries (the straggler window's two halves) with a monotonic clock's ns, as real ones look.
std::string sample_entries() {
  std::vector<std::pair<uint64_t, int64_t>> entries;
  for (uint64_t seq = 100000; seq < 100064; ++seq) entries.push_back({seq, 13385638123456 + static_cast<int64_t>(seq) * 7654321});
  return lf::serialize_entries(entries);
}

// A rank's progress: idle before the hang; from hang_start, inside collective #7 (all but the
// last rank, which never enters it).
std::string progress_text(int rank, int ranks, int64_t hang_start_ns, int64_t now) {
  lf::flight::Progress progress;
  progress.rank = rank;
  progress.pid = 100000 + rank;
  progress.host = "node" + std::to_string(rank / 128);
  progress.completed.seq = 6;
  progress.completed.op = "all_reduce";
  progress.completed.group = "world";
  progress.completed.done = true;
  progress.entered = progress.completed;
  if (now >= hang_start_ns && rank != ranks - 1) {
    progress.entered.seq = 7;
    progress.entered.done = false;
    progress.waiting = true;
    progress.waiting_call = progress.entered;
    progress.waiting_s = seconds_between(hang_start_ns, now);
  } else {
    progress.idle_s = seconds_between(now >= hang_start_ns ? hang_start_ns : now, now);
  }
  return progress.serialize();
}

// One node: ranks [first, first + count) as threads. Reports on `out`; waits on `in` for the
// steady window's start (its ns since the epoch of steady_clock).
void run_node(const Plan& plan, int first, int count, int in, int out) {
  std::unique_ptr<lf::internal::StoreRelay> relay;
  if (plan.nodes > 0) relay = std::make_unique<lf::internal::StoreRelay>("127.0.0.1", plan.port, std::chrono::seconds(300));
  std::atomic<int64_t> worker_requests{0};
  std::mutex mutex;
  std::condition_variable changed;
  int rendezvous_left = count;  // under mutex
  int64_t steady_start_ns = 0;  // under mutex
  std::atomic<int64_t> last_done_ns{0}, last_connected_ns{0}, last_arrived_ns{0};
  const auto latest = [](std::atomic<int64_t>& slot) {
    int64_t now = now_ns(), seen = slot.load();
    while (now > seen && !slot.compare_exchange_weak(seen, now)) {
    }
  };
  double rank0_cpu = -1, hang_reported = -1;
  std::atomic<bool> hang_seen{false};  // rank 0 reported: its node's ranks stop (the others at the planned end)
  const std::string entries = sample_entries();
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(count));
  for (int rank = first; rank < first + count; ++rank) {
    threads.emplace_back([&, rank] {
      lf::CollectiveOptions options;
      options.rank = rank;
      options.world_size = plan.ranks;
      options.main_address = "127.0.0.1";
      options.main_port = plan.port;
      options.use_agent_store = true;
      if (relay) options.store_relay = relay->address();
      options.settings.rendezvous_timeout = std::chrono::seconds(600);
      auto store = c10::make_intrusive<CountingStore>("/worker/attempt_0", lf::internal::connect_store(options),
                                                      worker_requests);
      latest(last_connected_ns);
      lf::internal::await_all_ranks(*store, options);
      latest(last_arrived_ns);
      lf::internal::vote_host_layout(*store, rank, plan.ranks);
      latest(last_done_ns);
      int64_t start = 0;
      {
        std::unique_lock<std::mutex> lock(mutex);
        if (--rendezvous_left == 0) changed.notify_all();
        changed.wait(lock, [&] { return steady_start_ns != 0; });  // no polling: 16k waking threads would starve the rest
        start = steady_start_ns;
      }
      const int64_t hang_start = start + static_cast<int64_t>(plan.steady_s * 1e9);
      const int64_t period_ns = std::chrono::nanoseconds(plan.period).count();
      const int64_t stop = hang_start + static_cast<int64_t>(plan.hang_timeout_s * 1e9) + 3 * period_ns;
      lf::internal::StoreWatch watch(c10::make_intrusive<c10d::PrefixStore>("lightning_fabric/watch", store), rank,
                                     plan.ranks);
      int64_t next = (start / period_ns + 1) * period_ns;  // the watchdog's tick: a multiple of the period
      double cpu_before = thread_cpu_s();
      int64_t judged = 0;  // rank 0's periods
      bool steady_measured = false;
      while (next < stop && !hang_seen.load()) {
        std::this_thread::sleep_until(at_ns(next));
        if (!steady_measured && next >= hang_start) {
          if (rank == 0) rank0_cpu = thread_cpu_s() - cpu_before;
          steady_measured = true;
        }
        // The watchdog's cadence: every rank publishes entries every period; rank 0 reads them every
        // store_watch_entries_every-th of its periods.
        watch.publish(progress_text(rank, plan.ranks, hang_start, now_ns()), entries, plan.entries);
        const bool with_entries = plan.entries && judged++ % lf::internal::store_watch_entries_every(plan.ranks) == 0;
        if (rank == 0 && hang_reported < 0) {
          std::vector<lf::flight::Progress> all;
          for (const auto& published : watch.read_all(with_entries)) {
            if (published) all.push_back(lf::flight::Progress::parse(published->progress));
          }
          if (lf::analyze_hang(all, plan.ranks, plan.hang_timeout_s).hung) {
            hang_reported = seconds_between(hang_start, now_ns());
            hang_seen = true;
          }
        }
        next += period_ns;
      }
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return rendezvous_left == 0; });
  }
  RendezvousLine done{last_connected_ns.load(), last_arrived_ns.load(), last_done_ns.load(), relay ? relay->counts().upstream_requests : worker_requests.load()};
  if (write(out, &done, sizeof(done)) != sizeof(done)) _exit(3);
  int64_t start = 0;
  if (read(in, &start, sizeof(start)) != sizeof(start)) _exit(3);
  const int64_t store_before = relay ? relay->counts().upstream_requests : worker_requests.load();
  const int64_t workers_before = worker_requests.load();
  const double cpu_before = process_cpu_s(getpid());
  {
    std::lock_guard<std::mutex> lock(mutex);
    steady_start_ns = start;
  }
  changed.notify_all();
  std::this_thread::sleep_until(at_ns(start + static_cast<int64_t>(plan.steady_s * 1e9)));
  SteadyLine steady;
  steady.node_cpu_s = process_cpu_s(getpid()) - cpu_before;
  steady.store_requests = (relay ? relay->counts().upstream_requests : worker_requests.load()) - store_before;
  steady.worker_requests = worker_requests.load() - workers_before;
  for (auto& thread : threads) thread.join();
  steady.rank0_cpu_s = first == 0 ? rank0_cpu : -1;
  steady.hang_reported_s = first == 0 ? hang_reported : -1;
  if (write(out, &steady, sizeof(steady)) != sizeof(steady)) _exit(3);
}

struct NodeProcess {
  pid_t pid = -1;
  int to = -1, from = -1;
};

template <typename Line>
Line read_line(const NodeProcess& node) {
  Line line;
  if (read(node.from, &line, sizeof(line)) != sizeof(line)) throw std::runtime_error("a node process failed");
  return line;
}
}  // namespace

int main(int argc, char** argv) {
  Plan plan;
  std::vector<std::string> positional;
  std::optional<int> period_ms;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--nodes" && i + 1 < argc) {
      plan.nodes = std::stoi(argv[++i]);
    } else if (arg == "--hang-timeout" && i + 1 < argc) {
      plan.hang_timeout_s = std::stod(argv[++i]);
    } else if (arg == "--no-entries") {
      plan.entries = false;
    } else if (arg == "--period-ms" && i + 1 < argc) {
      period_ms = std::stoi(argv[++i]);
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.empty() || plan.nodes < 0) {
    std::fprintf(stderr, "usage: bench_store_scale RANKS [STEADY_SECONDS] [--nodes N] [--hang-timeout S] [--period-ms MS]\n");
    return 2;
  }
  plan.ranks = std::stoi(positional[0]);
  plan.steady_s = positional.size() > 1 ? std::stod(positional[1]) : 10.0;
  const int processes = std::max(1, plan.nodes);
  if (plan.ranks % processes != 0) {
    std::fprintf(stderr, "bench_store_scale: --nodes %d must divide RANKS %d\n", plan.nodes, plan.ranks);
    return 2;
  }
  const int clients = plan.nodes > 0 ? plan.nodes : plan.ranks;
  plan.period = period_ms ? std::chrono::milliseconds(*period_ms)
                          : lf::internal::store_watch_period(plan.ranks, clients, std::chrono::seconds(300));
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = std::min<rlim_t>(files.rlim_max, static_cast<rlim_t>(plan.ranks) * 2 + 256);
  setrlimit(RLIMIT_NOFILE, &files);

  const pid_t store_pid = start_store(plan.port);
  plan.start_ns = now_ns();
  std::vector<NodeProcess> nodes;
  const int per_node = plan.ranks / processes;
  for (int node = 0; node < processes; ++node) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) throw std::runtime_error("pipe failed");
    const pid_t child = fork();
    if (child == 0) {
      close(down[1]);
      close(up[0]);
      try {
        run_node(plan, node * per_node, per_node, down[0], up[1]);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "node %d: %s\n", node, error.what());
        _exit(1);
      }
      _exit(0);
    }
    close(down[0]);
    close(up[1]);
    nodes.push_back({child, down[1], up[0]});
  }
  int64_t rendezvous_done = 0, rendezvous_requests = 0, connected = 0, arrived = 0;
  for (const auto& node : nodes) {
    const auto line = read_line<RendezvousLine>(node);
    rendezvous_done = std::max(rendezvous_done, line.done_ns);
    connected = std::max(connected, line.connected_ns);
    arrived = std::max(arrived, line.arrived_ns);
    rendezvous_requests += line.store_requests;
  }
  const double rendezvous_s = seconds_between(plan.start_ns, rendezvous_done);
  const int64_t steady_start = now_ns() + 200'000'000;
  for (const auto& node : nodes) {
    if (write(node.to, &steady_start, sizeof(steady_start)) != sizeof(steady_start)) throw std::runtime_error("write");
  }
  std::this_thread::sleep_until(at_ns(steady_start));
  const double store_cpu_before = process_cpu_s(store_pid);
  std::this_thread::sleep_until(at_ns(steady_start + static_cast<int64_t>(plan.steady_s * 1e9)));
  const double store_cpu = process_cpu_s(store_pid) - store_cpu_before;
  int64_t steady_requests = 0, worker_requests = 0;
  double node_cpu = 0, rank0_cpu = 0, hang_reported = -1;
  for (const auto& node : nodes) {
    const auto line = read_line<SteadyLine>(node);
    steady_requests += line.store_requests;
    worker_requests += line.worker_requests;
    node_cpu += line.node_cpu_s;
    if (line.rank0_cpu_s >= 0) rank0_cpu = line.rank0_cpu_s, hang_reported = line.hang_reported_s;
  }
  int failed = 0;
  for (const auto& node : nodes) {
    int status = 0;
    waitpid(node.pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  kill(store_pid, SIGTERM);
  waitpid(store_pid, nullptr, 0);
  const double period_s = std::chrono::duration<double>(plan.period).count();
  std::printf(
      "{\"ranks\": %d, \"nodes\": %d, \"relay\": %s, \"connected_s\": %.3f, \"arrived_s\": %.3f, \"rendezvous_s\": %.3f, \"rendezvous_store_requests_per_s\": %.0f, "
      "\"steady_s\": %.1f, \"period_ms\": %lld, \"steady_store_requests_per_s\": %.0f, "
      "\"steady_worker_requests_per_s\": %.0f, \"store_cpu_percent\": %.3f, \"node_cpu_percent\": %.3f, "
      "\"rank0_cpu_percent\": %.3f, \"hang_timeout_s\": %.1f, \"hang_reported_s\": %.2f, \"hang_bound_s\": %.2f}\n",
      plan.ranks, plan.nodes, plan.nodes > 0 ? "true" : "false", seconds_between(plan.start_ns, connected),
      seconds_between(plan.start_ns, arrived), rendezvous_s,
      static_cast<double>(rendezvous_requests) / rendezvous_s, plan.steady_s, static_cast<long long>(plan.period.count()),
      static_cast<double>(steady_requests) / plan.steady_s, static_cast<double>(worker_requests) / plan.steady_s,
      100.0 * store_cpu / plan.steady_s, 100.0 * node_cpu / processes / plan.steady_s,
      100.0 * rank0_cpu / plan.steady_s, plan.hang_timeout_s, hang_reported, plan.hang_timeout_s + 2 * period_s);
  return failed == 0 && hang_reported >= 0 && hang_reported <= plan.hang_timeout_s + 2 * period_s ? 0 : 1;
}
