// The rounds of an elastic job's rendezvous (--num-nodes MIN:MAX; docs/launcher.md, "Elastic
// membership"). Keys, under lightning-run/:
//   round                      the open round r (a counter; node 0 adds 1 to open the next)
//   round/<r>/arrivals         how many nodes other than node 0 arrived in round r
//   round/<r>/arrival/<k>      the node id of the k-th arrival (k = 1, 2, ...)
//   round/<r>/group            "attempt restart_count id0 id1 ...": the group node 0 formed; node
//                              rank = position, node 0's id (0) first
// Node 0 admits the first arrivals, up to MAX nodes in all; later arrivals wait for the next round.
#include <algorithm>
#include <iterator>
#include <sstream>
#include <thread>

#include "lightning/launcher/rendezvous.h"
#include "store_calls.h"

namespace lightning::launcher {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kWaitingCheckPeriod = std::chrono::seconds(1);
// How long node 0 waits, in a round after a failure, for a node that the failure named (a worker
// lost its connection to it) and that no longer beats. Short: if it is only slow, it arrives after
// the round formed and the group re-forms with it, at no cost to --max-restarts.
constexpr auto kSuspectSilence = std::chrono::seconds(3);

std::string round_key(int round, const std::string& rest) { return "round/" + std::to_string(round) + "/" + rest; }

struct GroupRecord {
  int attempt = 0;
  int restart_count = 0;
  std::vector<int> members;
};

std::string write_record(const GroupRecord& group) {
  std::ostringstream line;
  line << group.attempt << ' ' << group.restart_count;
  for (int id : group.members) line << ' ' << id;
  return line.str();
}

GroupRecord read_record(const std::string& line) {
  std::istringstream words(line);
  GroupRecord group;
  words >> group.attempt >> group.restart_count;
  group.members.assign(std::istream_iterator<int>(words), std::istream_iterator<int>());
  return group;
}

std::string seconds_text(std::chrono::milliseconds value) { return format_seconds(static_cast<double>(value.count()) / 1000.0) + "s"; }

}  // namespace

int Rendezvous::current_round() {
  const std::string name = key("round");
  return static_cast<int>(bounded([name](c10d::TCPStore& store) { return store.add(name, 0); }));
}

void Rendezvous::form_group(std::optional<AttemptEnd> after, const std::function<void(const std::string&)>& note,
                            const std::function<void()>& poll) {
  try {
    if (hosts_store_) {
      const int attempt = after ? layout_.attempt + 1 : 0;
      const int restarts = layout_.restart_count + (after && after->counts_as_restart ? 1 : 0);
      std::map<int, Heartbeat> expected;
      std::set<int> suspects;
      if (after) {
        // What the watch saw of the attempt that ended (nothing, if it failed before the first look).
        const bool watched = watched_attempt_ == layout_.attempt;
        const auto now = Clock::now();
        for (size_t node = 1; node < members_.size(); ++node) {
          if (watched && lost_ids_.count(members_[node]) > 0) continue;
          expected[members_[node]] = watched && node < heartbeats_.size() ? heartbeats_[node] : Heartbeat{-1, now};
        }
        for (const std::string& id : waiting_ids()) expected[std::stoi(id)] = Heartbeat{-1, now};
        for (int node : after->suspects) {
          if (node > 0 && node < static_cast<int>(members_.size())) suspects.insert(members_[static_cast<size_t>(node)]);
        }
      }
      const std::string name = key("round");
      const int round = after ? static_cast<int>(store_->add(name, 1)) : 0;
      watched_attempt_ = -1;
      host_round(round, attempt, restarts, std::move(expected), suspects, after.has_value());
      return;
    }
    const auto deadline = Clock::now() + timeout_;
    while (true) {
      int round = current_round();
      while (round <= round_) {  // wait for node 0 to open the next round
        poll();
        if (job_closed()) throw RendezvousError("the job ended before this node could join it; nothing to do", 0);
        if (Clock::now() > deadline) {
          throw RendezvousError("timed out after " + seconds_text(timeout_) + " waiting for node 0 to open a rendezvous round: the "
                                "job's group is full (--num-nodes=" + std::to_string(range_->min) + ":" +
                                std::to_string(range_->max) + ") and has not restarted. Raise MAX or --rdzv-timeout.",
                                1);
        }
        std::this_thread::sleep_for(4 * kPollInterval);
        beat();
        round = current_round();
      }
      if (join_round(round, poll)) return;
      note("the group formed without this node (it arrived late, or the group has --num-nodes MAX=" +
           std::to_string(range_->max) + " nodes); it waits to join at the next round");
    }
  } catch (const RendezvousError&) {
    throw;
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

void Rendezvous::host_round(int round, int attempt, int restart_count, std::map<int, Heartbeat> expected,
                            const std::set<int>& suspects, bool regrouping) {
  auto& store = *store_;
  const int min = range_->min, max = range_->max;
  const auto opened = Clock::now();
  std::optional<Clock::time_point> min_reached;
  std::map<int64_t, int> arrivals;  // arrival index -> node id
  std::vector<int> arrived;      // ids, in arrival order
  while (true) {
    const int64_t count = store.add(key(round_key(round, "arrivals")), 0);
    for (int64_t k = 1; k <= count; ++k) {
      if (arrivals.count(k) > 0) continue;
      const std::string name = key(round_key(round, "arrival/" + std::to_string(k)));
      if (store.check({name})) arrivals[k] = std::stoi(text(store.get(name)));  // else not yet named (or died first)
    }
    arrived.clear();
    for (const auto& entry : arrivals) arrived.push_back(entry.second);
    const int present = 1 + static_cast<int>(arrived.size());
    const auto now = Clock::now();
    if (present >= min && !min_reached) min_reached = now;
    forget_silent(expected, suspects, arrived);
    const bool all_back = regrouping && std::all_of(expected.begin(), expected.end(), [&](const auto& entry) {
      return std::find(arrived.begin(), arrived.end(), entry.first) != arrived.end();
    });
    if (present >= max || (min_reached && (all_back || now - *min_reached >= last_call_))) break;
    if (!min_reached && now - opened > timeout_) {
      throw RendezvousError("timed out after " + seconds_text(timeout_) + ": " + std::to_string(present) +
                                " node(s) joined rendezvous round " + std::to_string(round) + " at " + layout_.main_address +
                                ":" + std::to_string(layout_.main_port) + ", and --num-nodes=" + std::to_string(min) + ":" +
                                std::to_string(max) + " needs at least " + std::to_string(min) +
                                ". Start lightning-run on more nodes with the same --main-address, --main-port and "
                                "--num-nodes, or raise --rdzv-timeout.",
                            1);
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  if (static_cast<int>(arrived.size()) > max - 1) arrived.resize(static_cast<size_t>(max - 1));
  // Node ranks after node 0 follow the host names (torchrun sorts its nodes by address too), so a
  // node keeps its place relative to the others from round to round.
  std::vector<std::pair<std::string, int>> named;
  for (int id : arrived) named.emplace_back(text(store.get(key("node/" + std::to_string(id) + "/host"))), id);
  std::sort(named.begin(), named.end());
  GroupRecord group{attempt, restart_count, {node_id_}};
  for (const auto& entry : named) group.members.push_back(entry.second);
  store.set(key(round_key(round, "group")), bytes(write_record(group)));
  members_ = group.members;
  round_ = round;
  layout_.attempt = attempt;
  layout_.restart_count = restart_count;
  load_members(0);
}

void Rendezvous::forget_silent(std::map<int, Heartbeat>& expected, const std::set<int>& suspects, const std::vector<int>& arrived) {
  const auto now = Clock::now();
  if (now - last_beat_ < kWaitingCheckPeriod) return;
  last_beat_ = now;
  for (auto entry = expected.begin(); entry != expected.end();) {
    const bool in = std::find(arrived.begin(), arrived.end(), entry->first) != arrived.end();
    const int64_t count = in ? entry->second.count : store_->add(key("node/" + std::to_string(entry->first) + "/heartbeat"), 0);
    if (count != entry->second.count) entry->second = {count, now};
    const auto limit = suspects.count(entry->first) > 0 ? std::min<std::chrono::milliseconds>(kSuspectSilence, node_timeout_) : node_timeout_;
    const bool silent = !in && now - entry->second.changed >= limit;
    entry = silent ? expected.erase(entry) : std::next(entry);
  }
}

bool Rendezvous::join_round(int round, const std::function<void()>& poll) {
  const std::string arrivals = key(round_key(round, "arrivals")), group_name = key(round_key(round, "group"));
  const std::string arrival_prefix = key(round_key(round, "arrival/"));
  const int id = node_id_;
  bounded([arrivals, arrival_prefix, id](c10d::TCPStore& store) {
    const int64_t k = store.add(arrivals, 1);
    store.set(arrival_prefix + std::to_string(k), bytes(std::to_string(id)));
  });
  // Node 0 forms the round within --rdzv-timeout of opening it, or gives up and says so.
  const auto deadline = Clock::now() + timeout_ + last_call_ + std::chrono::seconds(5);
  std::optional<std::string> line;
  while (!(line = bounded([group_name](c10d::TCPStore& store) -> std::optional<std::string> {
             if (!store.check({group_name})) return std::nullopt;
             return text(store.get(group_name));
           }))) {
    poll();
    if (job_closed()) throw RendezvousError("the job ended before this node could join it; nothing to do", 0);
    if (Clock::now() > deadline) {
      throw RendezvousError("timed out after " + seconds_text(timeout_) + " waiting for node 0 to form rendezvous round " +
                                std::to_string(round) + " at " + layout_.main_address + ":" +
                                std::to_string(layout_.main_port),
                            1);
    }
    std::this_thread::sleep_for(kPollInterval);
    beat();
  }
  const GroupRecord group = read_record(*line);
  round_ = round;
  const auto place = std::find(group.members.begin(), group.members.end(), id);
  if (place == group.members.end()) return false;  // the round was full or formed before we arrived
  members_ = group.members;
  layout_.attempt = group.attempt;
  layout_.restart_count = group.restart_count;
  load_members(static_cast<int>(place - group.members.begin()));
  return true;
}

std::vector<std::string> Rendezvous::waiting_ids() {
  const int64_t count = store_->add(key(round_key(round_, "arrivals")), 0);
  std::vector<std::string> ids;
  for (int64_t k = 1; k <= count; ++k) {
    const std::string name = key(round_key(round_, "arrival/" + std::to_string(k)));
    if (!store_->check({name})) continue;
    const std::string id = text(store_->get(name));
    if (std::find(members_.begin(), members_.end(), std::stoi(id)) == members_.end()) ids.push_back(id);
  }
  return ids;
}

bool Rendezvous::job_closed() {
  const std::string name = key("closed");
  return bounded([name](c10d::TCPStore& store) { return store.check({name}); });
}

void Rendezvous::close_rounds() {
  if (!range_ || !hosts_store_) return;
  try {
    store_->set(key("closed"), bytes("1"));
    // Give a node that waits for a place time to read it before the store goes with this process.
    if (!waiting_ids().empty()) std::this_thread::sleep_for(std::chrono::seconds(1));
  } catch (const std::exception&) {
    // Node 0's own store: nothing to lose contact with.
  }
}

std::vector<std::string> Rendezvous::nodes_waiting() {
  std::vector<std::string> hosts;
  const auto now = Clock::now();
  if (!hosts_store_ || static_cast<int>(members_.size()) >= range_->max || now - last_waiting_check_ < kWaitingCheckPeriod) {
    return hosts;
  }
  last_waiting_check_ = now;
  for (const std::string& id : waiting_ids()) hosts.push_back(text(store_->get(key("node/" + id + "/host"))));
  return hosts;
}

}  // namespace lightning::launcher
