#include "lightning/fabric/plugins/collectives/collective_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/internal/store_chunks.h"
#include "lightning/fabric/internal/store_relay.h"
#include "lightning/fabric/internal/store_text.h"
#include "lightning/fabric/internal/wait_for_listener.h"
#include "lightning/fabric/utilities/process.h"

namespace lightning::fabric {

c10::intrusive_ptr<c10d::Store> host_store(const std::string& host, int port, std::chrono::milliseconds timeout,
                                           int* bound_port) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
  if (bound_port != nullptr) *bound_port = store->getPort();
  return store;
}

namespace internal {
namespace {
std::string duration_text(std::chrono::milliseconds duration) {
  std::ostringstream text;
  text << duration.count() / 1000.0 << " s";
  return text.str();
}

constexpr const char* kTimeoutHint =
    "Set the timeout with LT_RENDEZVOUS_TIMEOUT (seconds) or the strategy's process_group.rendezvous_timeout.";

std::string missing_ranks_message(c10d::Store& store, const CollectiveOptions& options) {
  std::vector<std::string> missing;
  for (int rank = 0; rank < options.world_size; ++rank) {
    if (!store.check({"lightning_fabric/arrived/" + std::to_string(rank)})) missing.push_back(std::to_string(rank));
  }
  std::string names;
  for (const auto& rank : missing) names += (names.empty() ? "" : ", ") + rank;
  const bool one = missing.size() == 1;
  return "Rank" + std::string(one ? " " : "s ") + names + " of " + std::to_string(options.world_size) +
         " did not join the process group within the rendezvous timeout (" +
         duration_text(options.settings.rendezvous_timeout) + "): " + (one ? "it" : "they") +
         " failed before joining or never started; see " + (one ? "its" : "their") + " output. " + kTimeoutHint;
}
}  // namespace

c10::intrusive_ptr<c10d::Store> connect_store(const CollectiveOptions& options) {
  const auto timeout = options.settings.rendezvous_timeout;
  if (options.use_agent_store && !options.store_relay.empty()) return connect_store_relay(options.store_relay, timeout);
  c10d::TCPStoreOptions tcp;
  tcp.port = static_cast<uint16_t>(options.main_port);
  tcp.isServer = !options.use_agent_store && options.rank == 0;
  tcp.waitWorkers = false;
  tcp.timeout = timeout;
  LF_CHECK(tcp.isServer || wait_for_listener(options.main_address, options.main_port, timeout), RuntimeError, "Rank ",
           options.rank, " could not reach the store ", options.use_agent_store ? "of the launcher" : "of rank 0",
           " at ", options.main_address, ":", options.main_port, " within the rendezvous timeout (",
           duration_text(timeout), "): ",
           options.use_agent_store ? "the launcher is gone" : "rank 0 did not start or failed before joining",
           ", or the address is wrong. ", kTimeoutHint);
  try {
    return c10::make_intrusive<c10d::TCPStore>(options.main_address, tcp);
  } catch (const c10::Error& error) {
    const std::string what = error.what_without_backtrace();
    if (!tcp.isServer || (what.find("EADDRINUSE") == std::string::npos && what.find("in use") == std::string::npos)) throw;
    throw RuntimeError("Rank 0 could not host the store on port " + std::to_string(options.main_port) +
                       ": the port is in use on this host, by another job or another step of this one. Give this "
                       "job a free port with MASTER_PORT (lightning-run: --main-port). Under Slurm each step of a job "
                       "gets 15000 + the job id's last four digits + 10000 x (step id mod 5), so steps whose ids "
                       "differ by 5 collide; set e.g. MASTER_PORT=$((20000 + SLURM_STEP_ID)) in the step.");
  }
}

void await_all_ranks(c10d::Store& store, const CollectiveOptions& options) {
  const std::string counter = "lightning_fabric/arrivals";
  store.set("lightning_fabric/arrived/" + std::to_string(options.rank), std::vector<uint8_t>{'1'});
  int64_t arrived = store.add(counter, 1);
  const auto deadline = std::chrono::steady_clock::now() + options.settings.rendezvous_timeout;
  auto pause = std::chrono::milliseconds(2);
  while (arrived < options.world_size) {
    if (std::chrono::steady_clock::now() >= deadline) throw RuntimeError(missing_ranks_message(store, options));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
    arrived = store.add(counter, 0);
  }
}

std::vector<HostLayout> host_layouts(const std::vector<std::string>& names) {
  std::vector<std::string> hosts;  // in the order of their lowest rank
  std::vector<int> count;
  std::vector<HostLayout> layouts(names.size());
  for (size_t rank = 0; rank < names.size(); ++rank) {
    const auto found = std::find(hosts.begin(), hosts.end(), names[rank]);
    layouts[rank].host = static_cast<int>(found - hosts.begin());
    if (found == hosts.end()) {
      hosts.push_back(names[rank]);
      count.push_back(0);
    }
    layouts[rank].local_index = count[layouts[rank].host]++;
  }
  const bool equal = std::all_of(count.begin(), count.end(), [&](int c) { return c == count[0]; });
  std::string counts;
  for (size_t h = 0; h < hosts.size(); ++h) {
    counts += (h ? ", " : "") + hosts[h] + ": " + std::to_string(count[h]) + (count[h] == 1 ? " rank" : " ranks");
  }
  for (auto& layout : layouts) {
    layout.hosts = static_cast<int>(hosts.size());
    layout.ranks_per_host = count[layout.host];
    layout.equal = equal;
    layout.counts = counts;
  }
  return layouts;
}

namespace {
// Rank 0 waits (a few requests however many ranks: one check of every name until all are there;
// c10d's wait on thousands of keys is quadratic in the server) and reads the names, its own first.
std::vector<std::string> gather_host_names(c10d::Store& store, int world_size, const std::string& own) {
  std::vector<std::string> keys;
  for (int peer = 1; peer < world_size; ++peer) keys.push_back("cpu-auto/host/" + std::to_string(peer));
  std::vector<std::string> names{own};
  if (keys.empty()) return names;
  const auto deadline = std::chrono::steady_clock::now() + store.getTimeout();
  auto pause = std::chrono::milliseconds(1);
  while (!check_in_chunks(store, keys)) {
    LF_CHECK(std::chrono::steady_clock::now() < deadline, RuntimeError, "The host vote: not every rank published "
             "its host name within the store timeout, although all had joined; a rank failed right after joining.");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  for (const auto& other : multi_get_in_chunks(store, keys)) names.push_back(store_text(other));
  return names;
}
}  // namespace

HostLayout vote_host_layout(c10d::Store& store, int rank, int world_size) {
  const std::string host = host_name();
  if (rank != 0) store.set("cpu-auto/host/" + std::to_string(rank), store_bytes(host));
  if (rank == 0) {
    const std::vector<HostLayout> layouts = host_layouts(gather_host_names(store, world_size, host));
    std::vector<std::string> keys;
    std::vector<std::vector<uint8_t>> records;
    for (int r = 0; r < world_size; ++r) {
      const HostLayout& layout = layouts[r];
      const std::string record = std::to_string(layout.host) + " " + std::to_string(layout.local_index) + " " +
                                 std::to_string(layout.hosts) + " " + std::to_string(layout.ranks_per_host) + " " +
                                 (layout.equal ? "1" : "0");
      keys.push_back("cpu-auto/layout/" + std::to_string(r));
      records.emplace_back(record.begin(), record.end());
    }
    keys.push_back("cpu-auto/counts");
    records.emplace_back(layouts[0].counts.begin(), layouts[0].counts.end());
    multi_set_in_chunks(store, keys, records);
    store.set("cpu-auto/layouts-written", store_bytes("1"));
  }
  // Every rank waits for one key (a store relay answers all of its node's ranks with one check),
  // then reads its own record.
  store.wait({"cpu-auto/layouts-written"});
  HostLayout layout;
  int equal = 1;
  std::istringstream(store_text(store.get("cpu-auto/layout/" + std::to_string(rank)))) >>
      layout.host >> layout.local_index >> layout.hosts >> layout.ranks_per_host >> equal;
  layout.equal = equal == 1;
  if (!layout.equal) layout.counts = store_text(store.get("cpu-auto/counts"));
  return layout;
}

}  // namespace internal
}  // namespace lightning::fabric
