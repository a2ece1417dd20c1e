// Simulated ranks against one TCPStore: the rendezvous and the steady-state hang watch at scale.
//   bench_store_scale RANKS [STEADY_SECONDS] [PERIOD_MS]
// A child process hosts the store (as lightning-run, torchrun's agent or rank 0 do). RANKS threads
// act as ranks, each with a connection of its own: they run the library's own rendezvous
// (connect_store, await_all_ranks, the same-host vote: collective_rendezvous.h), then publish their
// progress every PERIOD_MS (default: the watchdog's, store_watch_period) for STEADY_SECONDS
// (default 10) through
// StoreWatch, rank 0 also reading every rank back, as the hang watchdog does. Prints one JSON
// object: rendezvous seconds, store requests per second in each phase, and the steady state's CPU
// cost as a percentage of one core: the store's process, rank 0's thread, and the mean rank thread.
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "lightning/fabric/hang/flight_recorder.h"
#include "lightning/fabric/hang/store_watch.h"
#include "lightning/fabric/hang/straggler.h"
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

struct RankResult {
  double connected_s = 0;        // since the start: the store connection is up
  double arrived_s = 0;          // every rank has arrived (await_all_ranks)
  double rendezvous_done_s = 0;  // the same-host vote is done
  double steady_cpu_s = 0;       // this thread's CPU during the steady state
};

std::string sample_progress(int rank) {
  lf::flight::Progress progress;
  progress.rank = rank;
  progress.pid = 100000 + rank;
  progress.host = "node" + std::to_string(rank / 8);
  return progress.serialize();
}

std::string sample_entries() {
  std::vector<std::pair<uint64_t, int64_t>> entries;
  for (uint64_t seq = 1000; seq < 1064; ++seq) entries.push_back({seq, 123456789});
  return lf::serialize_entries(entries);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_store_scale RANKS [STEADY_SECONDS] [PERIOD_MS]\n");
    return 2;
  }
  const int ranks = std::stoi(argv[1]);
  const double steady_s = argc > 2 ? std::stod(argv[2]) : 10.0;
  const auto period = argc > 3 ? std::chrono::milliseconds(std::stoi(argv[3]))
                               : lf::internal::store_watch_period(ranks, ranks, std::chrono::seconds(300));  // the watchdog's
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = std::min<rlim_t>(files.rlim_max, static_cast<rlim_t>(ranks) * 2 + 256);
  setrlimit(RLIMIT_NOFILE, &files);

  int port = 0;
  const pid_t store_pid = start_store(port);
  std::atomic<int64_t> requests{0};
  std::atomic<int> rendezvous_left{ranks};
  std::atomic<bool> steady_go{false};
  std::vector<RankResult> results(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(ranks));
  const std::string entries = sample_entries();
  double steady_start_server_cpu = 0, steady_wall_s = 0;
  int64_t steady_start_requests = 0;

  const auto start = Clock::now();
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      lf::CollectiveOptions options;
      options.rank = rank;
      options.world_size = ranks;
      options.main_address = "127.0.0.1";
      options.main_port = port;
      options.use_agent_store = true;
      options.settings.rendezvous_timeout = std::chrono::seconds(300);
      const auto since_start = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
      auto base = lf::internal::connect_store(options);
      results[rank].connected_s = since_start();
      auto store = c10::make_intrusive<CountingStore>("/worker/attempt_0", base, requests);
      lf::internal::await_all_ranks(*store, options);
      results[rank].arrived_s = since_start();
      lf::internal::vote_host_layout(*store, rank, ranks);
      results[rank].rendezvous_done_s = std::chrono::duration<double>(Clock::now() - start).count();
      rendezvous_left.fetch_sub(1);
      while (!steady_go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      lf::internal::StoreWatch watch(c10::make_intrusive<c10d::PrefixStore>("lightning_fabric/watch", store), rank, ranks);
      const std::string progress = sample_progress(rank);
      std::mt19937 random(static_cast<unsigned>(rank));
      auto next = Clock::now() + std::chrono::milliseconds(random() % period.count());  // ranks do not beat in step
      const auto stop = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(steady_s));
      const double cpu_before = thread_cpu_s();
      while (next < stop) {
        std::this_thread::sleep_until(next);
        watch.publish(progress, entries, true);
        if (rank == 0) {
          for (const auto& published : watch.read_all(true)) {
            if (published) (void)lf::flight::Progress::parse(published->progress);
          }
        }
        next += period;
      }
      results[rank].steady_cpu_s = thread_cpu_s() - cpu_before;
    });
  }
  while (rendezvous_left.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const double rendezvous_s = std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t rendezvous_requests = requests.load();
  steady_start_server_cpu = process_cpu_s(store_pid);
  steady_start_requests = requests.load();
  const auto steady_start = Clock::now();
  steady_go = true;
  for (auto& thread : threads) thread.join();
  steady_wall_s = std::chrono::duration<double>(Clock::now() - steady_start).count();
  const double server_cpu = process_cpu_s(store_pid) - steady_start_server_cpu;
  const int64_t steady_requests = requests.load() - steady_start_requests;
  double rank_cpu_sum = 0;
  for (int rank = 1; rank < ranks; ++rank) rank_cpu_sum += results[rank].steady_cpu_s;
  const double mean_rank_cpu = ranks > 1 ? rank_cpu_sum / (ranks - 1) : 0.0;
  double connected = 0, arrived = 0;
  for (const auto& result : results) connected = std::max(connected, result.connected_s), arrived = std::max(arrived, result.arrived_s);
  kill(store_pid, SIGTERM);
  waitpid(store_pid, nullptr, 0);
  std::printf(
      "{\"ranks\": %d, \"connected_s\": %.3f, \"arrived_s\": %.3f, \"rendezvous_s\": %.3f, \"rendezvous_requests_per_s\": %.0f, \"steady_s\": %.2f, "
      "\"period_ms\": %lld, \"steady_requests_per_s\": %.0f, \"store_cpu_percent\": %.3f, "
      "\"rank0_cpu_percent\": %.3f, \"rank_cpu_percent\": %.4f}\n",
      ranks, connected, arrived, rendezvous_s, static_cast<double>(rendezvous_requests) / rendezvous_s, steady_wall_s,
      static_cast<long long>(period.count()), static_cast<double>(steady_requests) / steady_wall_s,
      100.0 * server_cpu / steady_wall_s, 100.0 * results[0].steady_cpu_s / steady_wall_s,
      100.0 * mean_rank_cpu / steady_wall_s);
  return 0;
}
