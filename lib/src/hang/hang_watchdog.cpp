#include "lightning/fabric/hang/hang_watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "lightning/fabric/hang/stack_trace.h"
#include "lightning/fabric/hang/flight_recorder.h"
#include "lightning/fabric/hang/hang_report.h"
#include "lightning/fabric/hang/store_watch.h"
#include "lightning/fabric/hang/straggler.h"
#include "lightning/fabric/internal/store_relay.h"
#include "lightning/fabric/utilities/error_file.h"

namespace lightning::fabric::internal {
namespace {

using Clock = std::chrono::steady_clock;


bool write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

std::string default_dump_dir() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "hang-%Y%m%d-%H%M%S", &local);
  return (std::filesystem::absolute("lightning_logs") / stamp).string();
}

// The next multiple of period on the monotonic clock: the ranks of one node publish at the same
// moment, so that their node's store relay sends them upstream together.
Clock::time_point next_tick(Clock::time_point now, std::chrono::milliseconds period) {
  const auto since = now.time_since_epoch();
  return Clock::time_point((since / period + 1) * period);
}

class Watchdog {
 public:
  explicit Watchdog(WatchdogSettings settings) : settings_(std::move(settings)) {
    install_stack_capture();
    if (!launcher_judges()) connect_store();
    thread_ = std::thread([this] { loop(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  // Launcher mode: lightning-run on one node maps the recorder files and judges.
  bool launcher_judges() const { return !settings_.group.flight_dir.empty() && settings_.group.launcher_judges_hangs; }

  std::chrono::milliseconds period() const {
    if (launcher_judges()) return std::chrono::milliseconds(200);
    return store_watch_period(settings_.world_size, store_clients(), settings_.group.hang_timeout);
  }

  // The store's clients: every rank, or one relay per node.
  int store_clients() const {
    if (settings_.store_relay.empty()) return settings_.world_size;
    const int per_node = std::max(1, settings_.local_world_size);
    return (settings_.world_size + per_node - 1) / per_node;
  }

  void connect_store() {
    if (!settings_.store_relay.empty()) {
      watch_.emplace(c10::make_intrusive<c10d::PrefixStore>(settings_.store_prefix + "/lightning_fabric/watch",
                                                            connect_store_relay(settings_.store_relay,
                                                                                std::chrono::seconds(30))),
                     settings_.rank, settings_.world_size);
      return;
    }
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(settings_.store_port);
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = std::chrono::seconds(30);
    auto base = c10::make_intrusive<c10d::TCPStore>(settings_.store_host, options);
    watch_.emplace(c10::make_intrusive<c10d::PrefixStore>(settings_.store_prefix + "/lightning_fabric/watch", base),
                   settings_.rank, settings_.world_size);
  }

  // With a recorder file, lightning-run may ask for dumps (`lightning-run status`) at any time: the
  // loop then wakes every 200 ms to answer, and publishes in the store only at its own period.
  std::chrono::milliseconds tick() const {
    if (settings_.group.flight_dir.empty()) return period();
    return std::min(period(), std::chrono::milliseconds(200));
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    Clock::time_point next_store_step = Clock::now();
    while (!stopping_) {
      lock.unlock();
      try {
        flight::Recorder::process()->heartbeat();
        if (!settings_.group.flight_dir.empty()) answer_launcher();  // dumps for a hang or a status request
        if (!launcher_judges() && Clock::now() >= next_store_step) {
          next_store_step = next_tick(Clock::now(), period());
          store_step();
        }
      } catch (const std::exception&) {
        // The store is gone (the job is ending): nothing left to watch.
        return;
      }
      lock.lock();
      wake_.wait_for(lock, tick(), [this] { return stopping_; });
    }
  }

  // Each new request of lightning-run (a hang's dumps, or `lightning-run status`) gets the dump
  // files in the folder it names; the job goes on.
  void answer_launcher() {
    flight::Header& header = flight::Recorder::process()->header();
    const uint32_t request = header.dump_request.load(std::memory_order_acquire);
    if (request == header.dump_done.load(std::memory_order_relaxed)) return;
    write_rank_dump(header.dump_dir);
    header.dump_done.store(request, std::memory_order_release);
  }

  std::string key(const std::string& what, int rank) const { return what + "/" + std::to_string(rank); }

  bool watches_stragglers() const { return settings_.group.straggler_threshold_s > 0 && settings_.world_size > 1; }

  // Every rank publishes its straggler entries every period (so that they are never older than a
  // period); rank 0 reads them every period up to 2048 ranks and every
  // store_watch_entries_every-th of its own periods beyond, since that read is most of the watch's
  // cost to the store.
  bool reads_entries_now() {
    if (!watches_stragglers()) return false;
    return judged_periods_++ % store_watch_entries_every(settings_.world_size) == 0;
  }

  void store_step() {
    flight::Recorder* recorder = flight::Recorder::process();
    std::string entries;
    if (watches_stragglers()) {
      entries = serialize_entries(recorder->entries(StragglerSettings().window * 2, flight::EntryTimes::kFromLeave));
    }
    if (auto requested = watch_->publish(recorder->progress().serialize(), entries, watches_stragglers())) {
      write_rank_dump(settings_.group.hang_dump_dir.empty() ? *requested : settings_.group.hang_dump_dir);
      watch_->mark_dumped();
      // Rank 0 reports and exits; its launcher then stops this rank. If none does, leave anyway.
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::_Exit(kHangExitCode);
    }
    if (settings_.rank == 0) judge(reads_entries_now());
  }

  // Rank 0: reads every rank's progress; on a hang, has every rank dump, reports and exits.
  void judge(bool with_entries) {
    const auto now = Clock::now();
    const auto published = watch_->read_all(with_entries);
    std::vector<flight::Progress> ranks;
    for (int rank = 0; rank < settings_.world_size; ++rank) {
      if (!published[rank]) continue;
      const std::string& text = published[rank]->progress;
      auto& seen = last_seen_[rank];
      if (seen.first != text) seen = {text, now};
      flight::Progress progress = flight::Progress::parse(text);
      // A rank's progress changes once a period: beyond the 1 s period of small jobs, up to two
      // periods without a change is normal, not silence.
      const double period_s = std::chrono::duration<double>(period()).count();
      const double silent_s = std::chrono::duration<double>(now - seen.second).count();
      progress.silent_s = std::max(0.0, silent_s - 2.0 * std::max(0.0, period_s - 1.0));
      ranks.push_back(progress);
    }
    const double timeout_s = std::chrono::duration<double>(settings_.group.hang_timeout).count();
    const HangVerdict verdict = analyze_hang(ranks, settings_.world_size, timeout_s);
    if (!verdict.hung) {
      if (with_entries) report_straggler(ranks, published);
      return;
    }

    const std::string dir = settings_.group.hang_dump_dir.empty() ? default_dump_dir() : settings_.group.hang_dump_dir;
    watch_->request_dump(dir);
    write_rank_dump(dir);
    // The ranks see the request when they next publish, within a period.
    const auto deadline = Clock::now() + std::chrono::seconds(5) + period();
    std::vector<int> silent;
    for (int rank = 1; rank < settings_.world_size; ++rank) {
      while (!watch_->dumped(rank) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!watch_->dumped(rank)) silent.push_back(rank);
    }
    std::string report = verdict.report + "dumps: " + dir + "/rank_<R>.flight.txt and rank_<R>.stack.txt";
    report += settings_.world_size > 1 ? " (each rank writes on its own node)\n" : "\n";
    const int waited_s = static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::seconds(5) + period()).count());
    for (int rank : silent) report += "  rank " + std::to_string(rank) + " did not write its dump within " + std::to_string(waited_s) + " s\n";
    std::error_code ignored;
    std::filesystem::create_directories(dir, ignored);
    write_file(std::filesystem::path(dir) / "report.txt", report);
    std::cerr << "lightning-fabric: " << report << "lightning-fabric: ending the job with exit code " << kHangExitCode
              << " (hang)" << std::endl;
    if (!settings_.group.error_file.empty()) write_error_file(settings_.group.error_file, "HangError", report);
    std::_Exit(kHangExitCode);
  }

  // Rank 0: names the rank that holds the job back (find_straggler over the entries every rank
  // published), once, and again only when another rank becomes the straggler.
  void report_straggler(const std::vector<flight::Progress>& ranks,
                        const std::vector<std::optional<PublishedProgress>>& published) {
    if (!watches_stragglers() || static_cast<int>(ranks.size()) != settings_.world_size) return;
    std::vector<RankEntries> entries;
    for (int rank = 0; rank < settings_.world_size; ++rank) entries.push_back({rank, parse_entries(published[rank]->entries)});
    StragglerSettings judged;
    judged.threshold_s = settings_.group.straggler_threshold_s;
    const auto verdict = find_straggler(entries, judged);
    if (!verdict || verdict->rank == named_straggler_) return;
    named_straggler_ = verdict->rank;
    std::string host;
    for (const auto& progress : ranks) {
      if (progress.rank == verdict->rank) host = progress.host;
    }
    std::cerr << "lightning-fabric: " << describe_straggler(*verdict, host, judged.threshold_s) << std::endl;
  }

  WatchdogSettings settings_;
  int named_straggler_ = -1;
  int64_t judged_periods_ = 0;  // rank 0: periods judged so far
  std::optional<StoreWatch> watch_;
  std::map<int, std::pair<std::string, Clock::time_point>> last_seen_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

std::mutex watchdog_mutex;
std::unique_ptr<Watchdog>& running_watchdog() {
  static std::unique_ptr<Watchdog> watchdog;
  return watchdog;
}

}  // namespace

bool start_hang_watchdog(const WatchdogSettings& settings) {
  std::lock_guard<std::mutex> lock(watchdog_mutex);
  if (running_watchdog() || flight::Recorder::process() == nullptr || settings.group.hang_timeout.count() <= 0) return false;
  running_watchdog() = std::make_unique<Watchdog>(settings);
  return true;
}

CollectiveWatch watch_collectives(const WatchdogSettings& settings) {
  const ProcessGroupSettings& group = settings.group;
  if (settings.world_size < 2 || group.flight_records == 0) return {};
  if (flight::Recorder::process() == nullptr) {
    const std::string file =
        group.flight_dir.empty() ? std::string() : group.flight_dir + "/rank_" + std::to_string(settings.rank) + ".flight";
    flight::Recorder::install(flight::Recorder::create(settings.rank, settings.world_size, group.flight_records, file));
  }
  CollectiveWatch watch;
  watch.recorder = flight::Recorder::process();
  watch.recorder->header().hang_timeout_ms = group.hang_timeout.count();
  watch.recorder->header().straggler_threshold_us = static_cast<int32_t>(group.straggler_threshold_s * 1e6);
  watch.owns_watchdog = start_hang_watchdog(settings);
  return watch;
}

void stop_hang_watchdog() {
  std::lock_guard<std::mutex> lock(watchdog_mutex);
  running_watchdog().reset();
}

std::string write_rank_dump(const std::string& dir) {
  flight::Recorder* recorder = flight::Recorder::process();
  if (recorder == nullptr || dir.empty()) return {};
  std::error_code ignored;
  std::filesystem::create_directories(dir, ignored);
  const flight::Header& header = recorder->header();
  const std::string rank = std::to_string(header.rank);
  const auto base = std::filesystem::path(dir);
  write_file(base / ("rank_" + rank + ".flight.txt"), recorder->dump_text());
  int tid = header.issuing_tid.load();
  if (tid == 0) tid = static_cast<int>(::getpid());
  write_file(base / ("rank_" + rank + ".stack.txt"),
             "# native stack of thread " + std::to_string(tid) + " (it issued rank " + rank +
                 "'s collectives), innermost frame first\n" +
                 capture_thread_stack(tid, std::chrono::seconds(2)));
  return (base / ("rank_" + rank + ".*.txt")).string();
}

}  // namespace lightning::fabric::internal
