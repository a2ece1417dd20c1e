#include "lightning/fabric/hang/hang_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

namespace lightning::fabric {
namespace {

using flight::Call;
using flight::Progress;

// A watchdog beats at least every second; five without one means the process is not running.
constexpr double kSilentAfterSeconds = 5.0;

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return text;
}

std::string rank_line(const Progress& rank) { return "  " + describe_rank(rank); }

}  // namespace

std::string describe_rank(const Progress& rank) {
  std::ostringstream line;
  line << "rank " << rank.rank << " (pid " << rank.pid << (rank.host.empty() ? "" : " on " + rank.host) << "): ";
  if (rank.steps >= 0) {
    line << "step " << rank.steps << " (" << (rank.steps == 0 ? "none yet, " : "last ")
         << format_seconds_text(rank.since_step_s) << " ago); ";
  }
  if (!rank.exited.empty()) {
    line << "exited (" << rank.exited << "); last entered " << rank.entered.describe()
         << (rank.entered.failed ? " (failed)" : rank.entered.done ? " (completed)" : " (not completed)");
  } else if (rank.waiting) {
    line << "waiting " << format_seconds_text(rank.waiting_s) << " in " << rank.waiting_call.describe()
         << "; last completed " << rank.completed.describe();
  } else {
    line << "not in a collective for " << format_seconds_text(rank.idle_s) << "; last entered "
         << rank.entered.describe() << (rank.entered.failed ? " (failed)" : rank.entered.done ? " (completed)" : "");
  }
  if (rank.exited.empty() && rank.silent_s >= kSilentAfterSeconds) {
    line << "; no heartbeat for " << format_seconds_text(rank.silent_s) << " (stopped, frozen or dead)";
  }
  return line.str();
}

namespace {

// Ranks that are not blocked in a collective while others are: why each is behind.
std::string behind_cause(const std::vector<const Progress*>& behind, const Call& target,
                         const std::vector<int>& waiting_ranks) {
  std::vector<int> gone, silent, busy;
  for (const Progress* rank : behind) {
    if (!rank->exited.empty()) {
      gone.push_back(rank->rank);
    } else if (rank->silent_s >= kSilentAfterSeconds) {
      silent.push_back(rank->rank);
    } else {
      busy.push_back(rank->rank);
    }
  }
  std::ostringstream cause;
  const std::string where = "collective " + target.describe() + " that " + rank_list(waiting_ranks) +
                            (waiting_ranks.size() == 1 ? " waits in" : " wait in");
  if (!busy.empty()) {
    cause << rank_list(busy) << (busy.size() == 1 ? " never entered " : " never entered ") << where
          << ": it is still running its own code (a loop, a deadlock, slow I/O; its stack trace shows where) or "
             "it skipped the collective.";
  }
  if (!silent.empty()) {
    cause << (busy.empty() ? "" : " ") << rank_list(silent) << " stopped responding outside " << where
          << ": the process is stopped, frozen or dying.";
  }
  if (!gone.empty()) {
    cause << (busy.empty() && silent.empty() ? "" : " ") << rank_list(gone) << " exited while " << where
          << ": it skipped collectives its peers run, or left early.";
  }
  return cause.str();
}

using Groups = std::map<std::string, std::vector<int>>;  // what ranks show -> the ranks showing it

// Ranks grouped by what `key` says of each: "rank 0<joiner>X<separator>ranks 1, 2<joiner>Y".
template <class Key>
Groups group_ranks(const std::vector<const Progress*>& ranks, Key key) {
  Groups groups;
  for (const Progress* rank : ranks) groups[key(*rank)].push_back(rank->rank);
  return groups;
}

std::string groups_text(const Groups& groups, const char* joiner, const char* separator) {
  std::string text;
  for (const auto& [shown, ranks] : groups) text += (text.empty() ? "" : separator) + rank_list(ranks) + joiner + shown;
  return text;
}

// Every rank known is blocked: compare where.
std::string waiting_cause(const std::vector<const Progress*>& waiting) {
  const Groups by_position = group_ranks(waiting, [](const Progress& rank) {
    return "#" + std::to_string(rank.waiting_call.seq) + " " + rank.waiting_call.op;
  });
  if (by_position.size() > 1) {
    return "the ranks are inside different collectives (" + groups_text(by_position, " in ", ", ") +
           "): they issue collectives in a different order or number; a rank skipped or added one.";
  }
  const Groups by_signature = group_ranks(waiting, [](const Progress& rank) {
    return rank.waiting_call.dtype + rank.waiting_call.shape;
  });
  if (by_signature.size() > 1) {
    return "mismatched shapes or dtypes in collective " + by_position.begin()->first + " (" +
           groups_text(by_signature, ": ", ", ") + "): every rank must pass the same dtype and shape.";
  }
  return "every rank waits in the same collective " + waiting.front()->waiting_call.describe() +
         ": the transport is stuck (the network, or a peer on another node), not the program's order.";
}

}  // namespace

std::string format_seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", seconds);
  return text;
}

std::string describe_positions(const std::vector<Progress>& ranks) {
  std::ostringstream text;
  std::map<uint64_t, std::vector<const Progress*>> by_seq;
  for (const auto& rank : ranks) {
    if (rank.rank < 0 || rank.entered.seq == 0) continue;
    text << rank_line(rank) << "\n";
    by_seq[rank.entered.seq].push_back(&rank);
  }
  for (const auto& [seq, group] : by_seq) {
    const Groups by_signature = group_ranks(group, [](const Progress& rank) {
      return rank.entered.op + " " + rank.entered.dtype + rank.entered.shape;
    });
    if (by_signature.size() < 2) continue;
    text << "likely cause: collective #" << seq << " differs across ranks (" << groups_text(by_signature, ": ", "; ")
         << "): every rank must issue the same collectives in the same order with the same dtype and shape "
            "(--check-collectives stops this before any data moves)\n";
  }
  return text.str();
}

HangVerdict analyze_hang(const std::vector<Progress>& ranks, int world_size, double timeout_s) {
  HangVerdict verdict;
  const Progress* longest = nullptr;
  for (const auto& rank : ranks) {
    if (rank.rank >= 0 && rank.exited.empty() && rank.waiting && (!longest || rank.waiting_s > longest->waiting_s)) {
      longest = &rank;
    }
  }
  if (longest == nullptr || longest->waiting_s < timeout_s) return verdict;
  verdict.hung = true;

  std::vector<const Progress*> known(world_size, nullptr);
  for (const auto& rank : ranks) {
    if (rank.rank >= 0 && rank.rank < world_size) known[rank.rank] = &rank;
  }
  std::vector<const Progress*> waiting, behind;
  std::vector<int> waiting_ranks, unknown;
  for (int r = 0; r < world_size; ++r) {
    const Progress* rank = known[r];
    if (rank == nullptr) {
      unknown.push_back(r);
    } else if (rank->waiting && rank->exited.empty()) {
      waiting.push_back(rank);
      waiting_ranks.push_back(r);
    } else {
      behind.push_back(rank);
    }
  }
  verdict.blamed_rank = behind.empty() ? (unknown.empty() ? longest->rank : unknown.front()) : behind.front()->rank;
  if (!behind.empty()) {
    verdict.cause = behind_cause(behind, longest->waiting_call, waiting_ranks);
  } else if (!unknown.empty()) {
    verdict.cause = rank_list(unknown) + " reported no progress: it never created its process group or cannot "
                    "be reached.";
  } else {
    verdict.cause = waiting_cause(waiting);
  }
  std::ostringstream report;
  report << "hang detected: rank " << longest->rank << " has waited " << format_seconds_text(longest->waiting_s)
         << " (the hang timeout is " << format_seconds_text(timeout_s) << ") in collective "
         << longest->waiting_call.describe() << "\n";
  for (int r = 0; r < world_size; ++r) {
    report << (known[r] ? rank_line(*known[r]) : "  rank " + std::to_string(r) + ": no progress reported") << "\n";
  }
  report << "likely cause: " << verdict.cause << "\n";
  verdict.report = report.str();
  return verdict;
}

}  // namespace lightning::fabric
