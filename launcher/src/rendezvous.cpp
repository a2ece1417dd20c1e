#include "lightning/launcher/rendezvous.h"

#include "lightning/fabric/utilities/process.h"
#include "lightning/launcher/status.h"
#include "store_calls.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace lightning::launcher {
namespace {

bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

// The family a client will use to reach host (IPv6 only for an IPv6 literal).
int address_family(const std::string& host) {
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 ? AF_INET6 : AF_INET;
}

std::string random_run_id() {
  std::random_device device;
  std::ostringstream id;
  id << std::hex << device() << device();
  return id.str();
}

std::chrono::milliseconds seconds(double value) {
  return std::chrono::milliseconds(static_cast<int64_t>(value * 1000.0));
}

constexpr auto kHeartbeatPeriod = std::chrono::seconds(1);

// Node ranks as the store holds them: "1,2", or "-" for none.
std::string join_nodes(const std::vector<int>& nodes) {
  std::string list;
  for (int node : nodes) list += (list.empty() ? "" : ",") + std::to_string(node);
  return list.empty() ? "-" : list;
}

std::vector<int> split_nodes(const std::string& list) {
  std::vector<int> nodes;
  std::istringstream items(list == "-" ? "" : list);
  for (std::string node; std::getline(items, node, ',');) nodes.push_back(std::stoi(node));
  return nodes;
}

// "10.0.0.2" / "fe80::1" for an AF_INET or AF_INET6 socket address; "" for any other.
std::string address_text(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = nullptr;
  if (address->sa_family == AF_INET) raw = &reinterpret_cast<const sockaddr_in*>(address)->sin_addr;
  if (address->sa_family == AF_INET6) raw = &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
  if (raw == nullptr || inet_ntop(address->sa_family, raw, text, sizeof(text)) == nullptr) return "";
  return text;
}

// This machine's IPv4 and IPv6 addresses, loopback left out, separated by spaces.
std::string own_addresses() {
  std::string list;
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return list;
  for (const ifaddrs* entry = all; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr) continue;
    const int family = entry->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    const std::string text = address_text(entry->ifa_addr);
    if (text.empty() || is_loopback(text)) continue;
    list += (list.empty() ? "" : " ") + text;
  }
  freeifaddrs(all);
  return list;
}

// own_addresses(), with `local_addr` first when it is an IP address not among them (not loopback).
std::string announced_addresses(const std::optional<std::string>& local_addr) {
  const std::string own = own_addresses();
  if (!local_addr || is_loopback(*local_addr)) return own;
  in_addr v4{};
  in6_addr v6{};
  const bool literal = inet_pton(AF_INET, local_addr->c_str(), &v4) == 1 || inet_pton(AF_INET6, local_addr->c_str(), &v6) == 1;
  std::istringstream words(own);
  const std::set<std::string> listed{std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
  if (!literal || listed.count(*local_addr) > 0) return own;
  return own.empty() ? *local_addr : *local_addr + " " + own;
}

// Of the nodes with their silence so far: none while no node has been silent for timeout_s; once
// one has, also those silent for all but two heartbeats of it, which went at the same moment (a
// partition) and are named together.
std::vector<LostNode> lost_together(std::vector<LostNode> silent, double timeout_s) {
  const bool any = std::any_of(silent.begin(), silent.end(), [&](const LostNode& node) { return node.silent_s >= timeout_s; });
  const double threshold = std::max(timeout_s / 2, timeout_s - 2.0 * std::chrono::duration<double>(kHeartbeatPeriod).count());
  silent.erase(std::remove_if(silent.begin(), silent.end(), [&](const LostNode& node) { return !any || node.silent_s < threshold; }),
               silent.end());
  return silent;
}

}  // namespace

std::string Rendezvous::key(const std::string& suffix) const { return "lightning-run/" + suffix; }

void Rendezvous::lost_contact(const std::exception& error) const {
  std::string reason = error.what();
  reason = reason.substr(0, reason.find('\n'));  // c10d appends a C++ stack trace
  throw RendezvousError("lost contact with the rendezvous store at " + layout_.main_address + ":" +
                            std::to_string(layout_.main_port) + " (node 0's lightning-run): " + reason,
                        1);
}

namespace {

// Whether address names this machine: loopback, its host name, or a name or address that resolves
// to one of its own addresses. An elastic job's node 0 is the node whose --main-address it is.
bool names_this_machine(const std::string& address) {
  if (is_loopback(address) || address == fabric::host_name()) return true;
  std::istringstream own(own_addresses());
  const std::set<std::string> mine{std::istream_iterator<std::string>(own), std::istream_iterator<std::string>()};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(address.c_str(), nullptr, &hints, &found) != 0) return false;
  bool match = false;
  for (const addrinfo* entry = found; entry != nullptr && !match; entry = entry->ai_next) {
    const std::string text = address_text(entry->ai_addr);
    match = !text.empty() && (mine.count(text) > 0 || is_loopback(text));
  }
  freeaddrinfo(found);
  return match;
}

// --num-nodes as the user wrote it: "2", or "2:4" for an elastic job.
std::string num_nodes_spelling(const LaunchArgs& args) {
  if (!args.elastic) return std::to_string(args.num_nodes);
  return std::to_string(args.elastic->min) + ":" + std::to_string(args.elastic->max);
}

}  // namespace

std::shared_ptr<c10d::TCPStore> Rendezvous::connect(const LaunchArgs& args, bool host) {
  c10d::TCPStoreOptions options;
  options.isServer = host;
  options.waitWorkers = false;
  options.timeout = timeout_;
  // A single-node job without --main-port takes a free port from the OS (no race: we bind it).
  const bool single = args.num_nodes == 1 && !args.elastic;
  options.port = static_cast<uint16_t>(args.main_port.value_or(single ? 0 : kDefaultMainPort));
  const bool local_only = single || is_loopback(args.main_address);
  const std::string where = args.main_address + ":" + std::to_string(options.port);
  try {
    if (host && local_only) set_loopback_only_binding(address_family(args.main_address));
    auto store = std::make_shared<c10d::TCPStore>(args.main_address, options);
    set_loopback_only_binding(AF_UNSPEC);
    return store;
  } catch (const std::exception& error) {
    set_loopback_only_binding(AF_UNSPEC);
    const std::string what = error.what();
    const bool in_use = what.find("ddress already in use") != std::string::npos;
    // Elastic nodes on one machine all name it: the first to bind hosts, the others join.
    if (host && in_use && args.elastic && is_loopback(args.main_address)) return nullptr;
    if (host && in_use) {
      throw RendezvousError("--main-port " + std::to_string(options.port) + " is already in use on this machine, so node 0 " +
                                "cannot host the rendezvous at " + where +
                                ". Another job or a leftover process holds it: choose another --main-port (the same "
                                "on every node) or stop that process.",
                            2);
    }
    if (host) throw RendezvousError("node 0 cannot host the rendezvous at " + where + ": " + what, 2);
    const std::string who = args.elastic ? std::string("this node") : "node " + std::to_string(args.node_rank);
    throw RendezvousError(who + " could not reach the rendezvous at " + where + " within --rdzv-timeout=" +
                              format_seconds(args.rdzv_timeout_s) +
                              "s. Check that node 0's lightning-run is running, that --main-address/--main-port "
                              "name it, and that the port is reachable from here. (" + what + ")",
                          1);
  }
}

Rendezvous Rendezvous::establish(const LaunchArgs& args, int local_world_size) {
  Rendezvous rendezvous;
  NodeLayout& layout = rendezvous.layout_;
  layout.node_rank = args.elastic ? -1 : args.node_rank;  // elastic: known once a round forms
  layout.num_nodes = args.num_nodes;
  layout.local_world_size = local_world_size;
  layout.main_address = args.main_address;
  layout.max_restarts = args.max_restarts;
  rendezvous.timeout_ = seconds(args.rdzv_timeout_s);
  rendezvous.node_timeout_ = seconds(args.node_timeout_s);
  rendezvous.range_ = args.elastic;
  rendezvous.last_call_ = seconds(args.rdzv_last_call_s);

  const bool host = args.elastic ? names_this_machine(args.main_address) : args.node_rank == 0;
  rendezvous.store_ = rendezvous.connect(args, host);
  rendezvous.hosts_store_ = host && rendezvous.store_ != nullptr;
  if (!rendezvous.store_) rendezvous.store_ = rendezvous.connect(args, false);
  layout.main_port = rendezvous.store_->getPort();
  rendezvous.publish_node(args, local_world_size);
  if (!args.elastic) rendezvous.register_node(args, local_world_size);
  return rendezvous;
}

void Rendezvous::publish_node(const LaunchArgs& args, int local_world_size) {
  auto& store = *store_;
  if (hosts_store_) {
    store.set(key("num_nodes"), bytes(num_nodes_spelling(args)));
    store.set(key("run_id"), bytes(random_run_id()));
  }
  if (!args.elastic) {
    node_id_ = args.node_rank;
    if (store.add(key("node/" + std::to_string(node_id_) + "/claims"), 1) > 1) {
      throw RendezvousError("another lightning-run already joined this rendezvous as --node-rank=" + std::to_string(node_id_) +
                                ". Give every node a different --node-rank in 0 .. " +
                                std::to_string(args.num_nodes - 1) + ".",
                            2);
    }
  } else {
    node_id_ = hosts_store_ ? 0 : static_cast<int>(store.add(key("node_ids"), 1));
  }
  const std::string agreed = text(store.get(key("num_nodes")));
  if (agreed != num_nodes_spelling(args)) {
    throw RendezvousError("this node was started with --num-nodes=" + num_nodes_spelling(args) +
                              " but node 0 with --num-nodes=" + agreed + ". Start every node with the same --num-nodes.",
                          2);
  }
  const std::string node = "node/" + std::to_string(node_id_);
  // --local-addr names this node to the others (torchrun's node descriptor: local_addr, else the
  // host name); an address literal joins the addresses a worker's error may name it by.
  store.set(key(node + "/host"), bytes(args.local_addr.value_or(fabric::host_name())));
  store.set(key(node + "/addresses"), bytes(announced_addresses(args.local_addr)));
  store.set(key(node + "/local_world_size"), bytes(std::to_string(local_world_size)));
  layout_.run_id = text(store.get(key("run_id")));
}

void Rendezvous::register_node(const LaunchArgs& args, int local_world_size) {
  (void)local_world_size;
  auto& store = *store_;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  std::vector<int> missing;
  while (true) {
    missing.clear();
    for (int node = 0; node < args.num_nodes; ++node) {
      if (!store.check({key("node/" + std::to_string(node) + "/local_world_size")})) missing.push_back(node);
    }
    if (missing.empty()) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::string list;
      for (int node : missing) list += (list.empty() ? "" : ", ") + std::to_string(node);
      throw RendezvousError("timed out after " + format_seconds(args.rdzv_timeout_s) +
                                "s waiting for node(s) " + list + " to join the rendezvous at " + layout_.main_address +
                                ":" + std::to_string(layout_.main_port) +
                                ". Start lightning-run on them with the same --main-address, --main-port and "
                                "--num-nodes, or raise --rdzv-timeout.",
                            1);
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  members_.clear();
  for (int node = 0; node < args.num_nodes; ++node) members_.push_back(node);
  load_members(args.node_rank);
}

void Rendezvous::load_members(int node_rank) {
  std::vector<int> counts;
  hosts_.clear();
  addresses_.clear();
  for (int id : members_) {
    const std::string node = key("node/" + std::to_string(id));
    const auto [count, host, addresses] = bounded([node](c10d::TCPStore& store) {
      return std::make_tuple(text(store.get(node + "/local_world_size")), text(store.get(node + "/host")),
                             text(store.get(node + "/addresses")));
    });
    counts.push_back(std::stoi(count));
    hosts_.push_back(host);
    std::istringstream words(addresses);
    addresses_.emplace_back(std::istream_iterator<std::string>(words), std::istream_iterator<std::string>());
  }
  fabric::place_node(layout_, node_rank, counts);
}

void Rendezvous::announce_failure(int attempt, const RemoteFailure& failure) {
  const std::string base = key("attempt/" + std::to_string(attempt) + "/failure");
  std::ostringstream record;
  record << failure.node_rank << ' ' << failure.global_rank << ' ' << failure.exit_code << ' ' << failure.regroup << ' '
         << join_nodes(failure.suspects) << ' ' << failure.summary;
  try {
    bounded([base, line = record.str()](c10d::TCPStore& store) {
      if (store.add(base + "/count", 1) == 1) store.set(base, bytes(line));
      store.add(base + "/seen", 1);
    });
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

void Rendezvous::wait_until_failure_seen(int attempt, std::chrono::milliseconds limit) {
  const std::string seen = key("attempt/" + std::to_string(attempt) + "/failure/seen");
  const auto deadline = std::chrono::steady_clock::now() + limit;
  try {
    while (bounded([seen](c10d::TCPStore& store) { return store.add(seen, 0); }) < layout_.num_nodes &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(kPollInterval);
    }
  } catch (const std::exception&) {
    // Only node 0 waits, on its own store: nothing to lose contact with.
  }
}

std::optional<RemoteFailure> Rendezvous::failure(int attempt) {
  const std::string base = key("attempt/" + std::to_string(attempt) + "/failure");
  try {
    const bool first_look = !failure_seen_.count(attempt);
    const auto line = bounded([base, first_look](c10d::TCPStore& store) -> std::optional<std::string> {
      if (!store.check({base})) return std::nullopt;
      std::string found = text(store.get(base));
      if (first_look) store.add(base + "/seen", 1);
      return found;
    });
    if (!line) return std::nullopt;
    failure_seen_.insert(attempt);
    std::istringstream record(*line);
    RemoteFailure failure;
    std::string suspects;
    record >> failure.node_rank >> failure.global_rank >> failure.exit_code >> failure.regroup >> suspects;
    failure.suspects = split_nodes(suspects);
    std::getline(record >> std::ws, failure.summary);
    return failure;
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

std::vector<std::string> Rendezvous::exchange_memory_endpoints(int attempt, int port) {
  const auto node = static_cast<size_t>(layout_.node_rank);
  std::string host = node < hosts_.size() ? hosts_[node] : fabric::host_name();
  if (is_loopback(layout_.main_address)) {
    host = "127.0.0.1";
  } else if (node < addresses_.size() && !addresses_[node].empty()) {
    host = addresses_[node].front();
  }
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  const std::string prefix = key("attempt/" + std::to_string(attempt) + "/memory/");
  std::vector<std::string> endpoints;
  try {
    const std::string mine = prefix + std::to_string(layout_.node_rank);
    const std::string value = host + ":" + std::to_string(port);
    bounded([&](c10d::TCPStore& store) { store.set(mine, bytes(value)); });
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (int other = 0; other < layout_.num_nodes; ++other) {
      const std::string name = prefix + std::to_string(other);
      while (!bounded([&](c10d::TCPStore& store) { return store.check({name}); })) {
        if (std::chrono::steady_clock::now() > deadline) {
          throw RendezvousError("timed out waiting for node " + std::to_string(other) + "'s memory server (--in-memory-replicas)", 1);
        }
        std::this_thread::sleep_for(kPollInterval);
      }
      endpoints.push_back(text(bounded([&](c10d::TCPStore& store) { return store.get(name); })));
    }
  } catch (const RendezvousError&) {
    throw;
  } catch (const std::exception& error) {
    lost_contact(error);
  }
  return endpoints;
}

void Rendezvous::wait_for_attempt(int attempt) {
  const std::string name = key("attempt/" + std::to_string(attempt) + "/ready");
  try {
    bounded([name](c10d::TCPStore& store) { store.add(name, 1); });
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (bounded([name](c10d::TCPStore& store) { return store.add(name, 0); }) < layout_.num_nodes) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw RendezvousError("timed out waiting for every node to restart attempt " + std::to_string(attempt), 1);
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  } catch (const RendezvousError&) {
    throw;
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

int64_t Rendezvous::status_requests() {
  const std::string name = status_requests_key();
  try {
    return bounded([name](c10d::TCPStore& store) { return store.add(name, 0); });
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

void Rendezvous::answer_status(int64_t request, const std::string& text) {
  const std::string base = status_answer_key(request, "");
  const std::string mine = base + "node/" + std::to_string(layout_.node_rank);
  const bool first = layout_.node_rank == 0;
  const std::string nodes = std::to_string(layout_.num_nodes);
  try {
    bounded([=](c10d::TCPStore& store) {
      store.set(mine, bytes(text));
      if (first) store.set(base + "nodes", bytes(nodes));
    });
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

void Rendezvous::announce_done(int attempt) {
  const std::string done = key("attempt/" + std::to_string(attempt) + "/done");
  const std::string mine = done + "/" + std::to_string(layout_.node_rank);
  try {
    bounded([done, mine](c10d::TCPStore& store) {
      store.set(mine, bytes("1"));
      store.add(done, 1);
    });
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

bool Rendezvous::all_done(int attempt) {
  try {
    const std::string done = key("attempt/" + std::to_string(attempt) + "/done");
    return bounded([done](c10d::TCPStore& store) { return store.add(done, 0); }) >= layout_.num_nodes;
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

namespace {
// Whether text holds address as a whole word: not inside a longer address (10.0.0.1 is not in
// 110.0.0.12; hex digits and ':' count as part of an address, for IPv6).
bool mentions_address(const std::string& text, const std::string& address) {
  const auto part_of_address = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == '.' || c == ':'; };
  for (size_t at = text.find(address); at != std::string::npos; at = text.find(address, at + 1)) {
    const size_t end = at + address.size();
    const bool starts = at == 0 || !part_of_address(text[at - 1]) || (text[at - 1] == ':' && address.find(':') == std::string::npos);
    const bool ends = end == text.size() || !part_of_address(text[end]) || (text[end] == ':' && address.find(':') == std::string::npos);
    if (starts && ends) return true;
  }
  return false;
}
}  // namespace

std::vector<NamedNode> Rendezvous::nodes_named_in(const std::string& text) const {
  std::map<std::string, int> owners;  // an address several nodes have (docker0, ...) names none
  for (const auto& addresses : addresses_) {
    for (const auto& address : addresses) ++owners[address];
  }
  std::vector<NamedNode> named;
  for (size_t node = 0; node < addresses_.size(); ++node) {
    if (static_cast<int>(node) == layout_.node_rank) continue;
    for (const std::string& address : addresses_[node]) {
      if (owners[address] > 1 || !mentions_address(text, address)) continue;
      named.push_back({static_cast<int>(node), address + " (node " + std::to_string(node) + ", " + hosts_[node] + ")"});
      break;
    }
  }
  return named;
}

void Rendezvous::publish_suspects(int attempt, const std::vector<int>& suspects) {
  const std::string name = key("attempt/" + std::to_string(attempt) + "/suspects/" + std::to_string(layout_.node_rank));
  try {
    bounded([name, list = join_nodes(suspects)](c10d::TCPStore& store) { store.set(name, bytes(list)); });
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

SuspectTrace Rendezvous::trace_suspects(int attempt, const std::vector<int>& named, std::chrono::milliseconds limit) {
  const std::string base = key("attempt/" + std::to_string(attempt) + "/suspects/");
  const auto deadline = std::chrono::steady_clock::now() + limit;
  const auto record_of = [this, &base](int node) {
    return bounded([name = base + std::to_string(node)](c10d::TCPStore& store) -> std::optional<std::string> {
      if (!store.check({name})) return std::nullopt;
      return text(store.get(name));
    });
  };
  SuspectTrace trace;
  std::set<int> visited{layout_.node_rank};
  std::vector<int> frontier;
  for (int node : named) {
    if (visited.insert(node).second) frontier.push_back(node);
  }
  try {
    while (!frontier.empty()) {
      std::map<int, std::vector<int>> records;  // the frontier's published suspects, as they arrive
      while (true) {
        for (int node : frontier) {
          if (records.count(node) != 0) continue;
          if (auto line = record_of(node)) records[node] = split_nodes(*line);
        }
        if (records.size() == frontier.size() || std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(kPollInterval);
      }
      std::vector<int> onward;
      for (int node : frontier) {
        const auto record = records.find(node);
        if (record == records.end()) {
          trace.lost.push_back(node);
        } else if (record->second.empty()) {
          trace.failed.push_back(node);
        } else if (std::all_of(record->second.begin(), record->second.end(), [this](int n) { return n == layout_.node_rank; })) {
          trace.lost.push_back(node);  // it names only this node: the two lost each other (their link)
        } else {
          for (int further : record->second) {
            if (visited.insert(further).second) onward.push_back(further);
          }
        }
      }
      frontier = std::move(onward);
    }
  } catch (const std::exception& error) {
    lost_contact(error);
  }
  if (trace.lost.empty() && trace.failed.empty()) trace.lost = named;  // the named nodes blame one another
  std::sort(trace.lost.begin(), trace.lost.end());
  std::sort(trace.failed.begin(), trace.failed.end());
  std::vector<int> named_sorted = named;
  std::sort(named_sorted.begin(), named_sorted.end());
  trace.followed = !trace.failed.empty() || trace.lost != named_sorted;
  return trace;
}

std::string Rendezvous::describe_node(int node_rank) const {
  return "node " + std::to_string(node_rank) + " (" + hosts_.at(static_cast<size_t>(node_rank)) + ")";
}

void Rendezvous::beat() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_beat_ < kHeartbeatPeriod) return;
  last_beat_ = now;
  const std::string name = key("node/" + std::to_string(node_id_) + "/heartbeat");
  try {
    bounded([name](c10d::TCPStore& store) { store.add(name, 1); });
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

std::vector<LostNode> Rendezvous::watch_nodes(int attempt) {
  const auto now = std::chrono::steady_clock::now();
  if (watched_attempt_ != attempt) {
    watched_attempt_ = attempt;
    heartbeats_.assign(static_cast<size_t>(layout_.num_nodes), Heartbeat{-1, now});
    lost_ids_.clear();
  }
  std::vector<LostNode> lost;
  if (!hosts_store_) {
    beat();
    return lost;
  }
  if (now - last_beat_ < kHeartbeatPeriod) return lost;
  last_beat_ = now;
  try {
    for (int node = 1; node < layout_.num_nodes; ++node) {
      const std::string beat = key("node/" + std::to_string(members_[static_cast<size_t>(node)]) + "/heartbeat");
      const std::string done = key("attempt/" + std::to_string(attempt) + "/done/" + std::to_string(node));
      const auto [count, finished] = bounded([beat, done](c10d::TCPStore& store) {
        return std::make_pair(store.add(beat, 0), store.check({done}));
      });
      Heartbeat& seen = heartbeats_[static_cast<size_t>(node)];
      if (finished) continue;
      if (count != seen.count) {
        seen = {count, now};
        continue;
      }
      lost.push_back({node, hosts_[static_cast<size_t>(node)], std::chrono::duration<double>(now - seen.changed).count()});
    }
  } catch (const std::exception& error) {
    lost_contact(error);
  }
  lost = lost_together(std::move(lost), static_cast<double>(node_timeout_.count()) / 1000.0);
  for (const LostNode& node : lost) lost_ids_.insert(members_[static_cast<size_t>(node.node_rank)]);
  return lost;
}

}  // namespace lightning::launcher
