#include "lightning/fabric/hang/hang_watch.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace lightning::fabric {

// flight:: is lightning::fabric::flight.

HangWatch::HangWatch(std::string attempt_dir, int rank_offset, int local_count, int world_size)
    : attempt_dir_(std::move(attempt_dir)), rank_offset_(rank_offset), world_size_(world_size), recorders_(local_count) {}

int HangWatch::period_ms() const {
  if (timeout_ms_ <= 0) return 1000;
  return static_cast<int>(std::clamp<int64_t>(timeout_ms_ / 10, 50, 1000));
}

std::vector<flight::Progress> HangWatch::read(const std::vector<std::string>& exited) {
  std::vector<flight::Progress> ranks;
  for (size_t local = 0; local < recorders_.size(); ++local) {
    auto& recorder = recorders_[local];
    if (!recorder) {
      recorder = flight::Recorder::attach(attempt_dir_ + "/rank_" + std::to_string(rank_offset_ + local) + ".flight");
      if (!recorder) continue;
    }
    timeout_ms_ = recorder->header().hang_timeout_ms;
    flight::Progress progress = recorder->progress();
    if (local < exited.size()) progress.exited = exited[local];
    ranks.push_back(progress);
  }
  return ranks;
}

std::optional<std::pair<StragglerVerdict, std::string>> HangWatch::straggler() {
  if (static_cast<int>(recorders_.size()) != world_size_) return std::nullopt;  // every rank must be local
  const auto ranks = read({});
  if (static_cast<int>(ranks.size()) != world_size_) return std::nullopt;
  StragglerSettings settings;
  settings.threshold_s = recorders_.front()->header().straggler_threshold_us / 1e6;
  std::vector<RankEntries> entries;
  for (size_t local = 0; local < recorders_.size(); ++local) {
    entries.push_back({rank_offset_ + static_cast<int>(local), recorders_[local]->entries(settings.window * 2)});
  }
  auto verdict = find_straggler(entries, settings);
  if (!verdict) return std::nullopt;
  return std::make_pair(*verdict, describe_straggler(*verdict, ranks.front().host, settings.threshold_s));
}

std::string HangWatch::positions(const std::vector<std::string>& exited) { return fabric::describe_positions(read(exited)); }

std::optional<fabric::HangVerdict> HangWatch::check(const std::vector<std::string>& exited) {
  const std::vector<flight::Progress> ranks = read(exited);
  if (ranks.empty() || timeout_ms_ <= 0) return std::nullopt;
  fabric::HangVerdict verdict = fabric::analyze_hang(ranks, world_size_, static_cast<double>(timeout_ms_) / 1000.0);
  if (!verdict.hung) return std::nullopt;
  return verdict;
}

std::vector<uint32_t> HangWatch::request_dumps(const std::string& dir, const std::vector<std::string>& exited) {
  read({});  // attaches the recorders that exist by now
  std::error_code ignored;
  std::filesystem::create_directories(dir, ignored);
  std::vector<uint32_t> requests;
  for (size_t local = 0; local < recorders_.size(); ++local) {
    const bool gone = local < exited.size() && !exited[local].empty();
    // Hang timeout 0: the rank runs no watchdog thread, so nothing would answer.
    const bool watched = recorders_[local] && recorders_[local]->header().hang_timeout_ms > 0;
    requests.push_back(watched && !gone ? recorders_[local]->request_dump(dir) : 0);
  }
  return requests;
}

bool HangWatch::dumps_answered(const std::vector<uint32_t>& requests, const std::vector<std::string>& exited) const {
  for (size_t local = 0; local < requests.size() && local < recorders_.size(); ++local) {
    const bool gone = local < exited.size() && !exited[local].empty();
    if (requests[local] != 0 && !gone && !recorders_[local]->dump_answered(requests[local])) return false;
  }
  return true;
}

std::string HangWatch::dump(const fabric::HangVerdict& verdict, std::chrono::milliseconds wait,
                            const std::function<void(std::chrono::milliseconds)>& idle) {
  const std::filesystem::path dir = std::filesystem::path(attempt_dir_) / "hang";
  const std::vector<uint32_t> requests = request_dumps(dir.string(), {});
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (!dumps_answered(requests, {}) && std::chrono::steady_clock::now() < deadline) idle(std::chrono::milliseconds(50));

  std::string notes;
  for (size_t local = 0; local < recorders_.size(); ++local) {
    const std::string rank = std::to_string(rank_offset_ + local);
    const auto& recorder = recorders_[local];
    if (!recorder) {
      notes += "  rank " + rank + " has no recorder (it never created its process group)\n";
      continue;
    }
    if (recorder->dump_answered(requests[local])) continue;
    std::ofstream(dir / ("rank_" + rank + ".flight.txt")) << recorder->dump_text();
    std::ofstream(dir / ("rank_" + rank + ".stack.txt"))
        << "no stack: rank " << rank << " did not answer the dump request (stopped, frozen or gone)\n";
    notes += "  rank " + rank + " did not answer: its recorder was read from shared memory, no stack trace\n";
  }
  std::string report = verdict.report + notes + "dumps: " + dir.string() +
                       "/ (report.txt, rank_<R>.flight.txt: the flight recorder, rank_<R>.stack.txt: the native "
                       "stack of the thread that issued the collectives)\n";
  std::ofstream(dir / "report.txt") << report;
  return report;
}

std::string HangWatch::status(const std::vector<std::string>& exited, const std::string& dir,
                              const std::vector<uint32_t>& requests) {
  std::vector<flight::Progress> ranks = read(exited);
  std::ostringstream text;
  size_t next = 0;
  for (size_t local = 0; local < recorders_.size(); ++local) {
    const int rank = rank_offset_ + static_cast<int>(local);
    const bool gone = local < exited.size() && !exited[local].empty();
    if (!recorders_[local]) {
      text << "  rank " << rank << ": no flight recorder" << (gone ? " (exited: " + exited[local] + ")" : "")
           << ": it has not created its process group yet, or it records nothing (a job of one process, or "
              "LT_FLIGHT_RECORDS=0)\n";
      continue;
    }
    flight::Progress& progress = ranks[next++];
    // Without a watchdog (hang timeout 0) nothing beats: no heartbeat means nothing then.
    if (recorders_[local]->header().hang_timeout_ms <= 0) progress.silent_s = 0;
    text << "  " << fabric::describe_rank(progress) << "\n";
    if (gone) continue;
    const uint32_t request = local < requests.size() ? requests[local] : 0;
    std::ifstream file(std::filesystem::path(dir) / ("rank_" + std::to_string(rank) + ".stack.txt"));
    std::string line;
    if (request == 0 || !recorders_[local]->dump_answered(request) || !std::getline(file, line)) {
      text << "    no stack: ";
      if (recorders_[local]->header().hang_timeout_ms <= 0) {
        text << "hang detection is off for this rank (hang timeout 0), and with it the thread that captures stacks\n";
      } else if (request == 0) {
        text << "its recorder appeared after the request; ask again\n";
      } else {
        text << "rank " << rank << " did not answer within 3 s (stopped, frozen, or blocked with signals masked)\n";
      }
      continue;
    }
    text << "    " << (line.rfind("# ", 0) == 0 ? line.substr(2) : line) << "\n";
    while (std::getline(file, line)) text << "    " << line << "\n";
  }
  return text.str();
}

}  // namespace lightning::fabric
