#include "lightning/launcher/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <unistd.h>

#include <random>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace lightning::launcher {
namespace {

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }
std::string text(const std::vector<uint8_t>& data) { return {data.begin(), data.end()}; }

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

constexpr auto kPollInterval = std::chrono::milliseconds(50);

}  // namespace

std::string Rendezvous::key(const std::string& suffix) const { return "lightning-run/" + suffix; }

void Rendezvous::lost_contact(const std::exception& error) const {
  std::string reason = error.what();
  reason = reason.substr(0, reason.find('\n'));  // c10d appends a C++ stack trace
  throw RendezvousError("lost contact with the rendezvous store at " + layout_.main_address + ":" +
                            std::to_string(layout_.main_port) + " (node 0's lightning-run): " + reason,
                        1);
}

Rendezvous Rendezvous::establish(const LaunchArgs& args, int local_world_size) {
  Rendezvous rendezvous;
  NodeLayout& layout = rendezvous.layout_;
  layout.node_rank = args.node_rank;
  layout.num_nodes = args.num_nodes;
  layout.local_world_size = local_world_size;
  layout.main_address = args.main_address;
  layout.max_restarts = args.max_restarts;
  rendezvous.timeout_ = seconds(args.rdzv_timeout_s);

  c10d::TCPStoreOptions options;
  options.isServer = args.node_rank == 0;
  options.waitWorkers = false;
  options.timeout = rendezvous.timeout_;
  // A single-node job without --main-port takes a free port from the OS (no race: we bind it).
  options.port = static_cast<uint16_t>(args.main_port.value_or(args.num_nodes == 1 ? 0 : kDefaultMainPort));
  const bool local_only = args.num_nodes == 1 || is_loopback(args.main_address);
  try {
    if (options.isServer && local_only) set_loopback_only_binding(address_family(args.main_address));
    rendezvous.store_ = std::make_shared<c10d::TCPStore>(args.main_address, options);
    set_loopback_only_binding(AF_UNSPEC);
  } catch (const std::exception& error) {
    set_loopback_only_binding(AF_UNSPEC);
    const std::string where = args.main_address + ":" + std::to_string(options.port);
    const std::string what = error.what();
    if (options.isServer && what.find("ddress already in use") != std::string::npos) {
      throw RendezvousError("--main-port " + std::to_string(options.port) + " is already in use on this machine, so node 0 " +
                                "cannot host the rendezvous at " + where +
                                ". Another job or a leftover process holds it: choose another --main-port (the same "
                                "on every node) or stop that process.",
                            2);
    }
    if (options.isServer) {
      throw RendezvousError("node 0 cannot host the rendezvous at " + where + ": " + what, 2);
    }
    throw RendezvousError("node " + std::to_string(args.node_rank) + " could not reach the rendezvous at " + where +
                              " within --rdzv-timeout=" + format_seconds(args.rdzv_timeout_s) +
                              "s. Check that node 0's lightning-run is running, that --main-address/--main-port "
                              "name it, and that the port is reachable from here. (" + what + ")",
                          1);
  }
  layout.main_port = rendezvous.store_->getPort();
  rendezvous.register_node(args, local_world_size);
  return rendezvous;
}

void Rendezvous::register_node(const LaunchArgs& args, int local_world_size) {
  auto& store = *store_;
  const int rank = args.node_rank;
  if (rank == 0) {
    store.set(key("num_nodes"), bytes(std::to_string(args.num_nodes)));
    store.set(key("run_id"), bytes(random_run_id()));
  }
  if (store.add(key("node/" + std::to_string(rank) + "/claims"), 1) > 1) {
    throw RendezvousError("another lightning-run already joined this rendezvous as --node-rank=" + std::to_string(rank) +
                              ". Give every node a different --node-rank in 0 .. " +
                              std::to_string(args.num_nodes - 1) + ".",
                          2);
  }
  const int agreed = std::stoi(text(store.get(key("num_nodes"))));
  if (agreed != args.num_nodes) {
    throw RendezvousError("this node was started with --num-nodes=" + std::to_string(args.num_nodes) +
                              " but node 0 with --num-nodes=" + std::to_string(agreed) +
                              ". Start every node with the same --num-nodes.",
                          2);
  }
  store.set(key("node/" + std::to_string(rank) + "/local_world_size"), bytes(std::to_string(local_world_size)));

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
  std::vector<int> counts;
  for (int node = 0; node < args.num_nodes; ++node) {
    counts.push_back(std::stoi(text(store.get(key("node/" + std::to_string(node) + "/local_world_size")))));
  }
  fabric::place_node(layout_, rank, counts);
  layout_.run_id = text(store.get(key("run_id")));
}

void Rendezvous::announce_failure(int attempt, const RemoteFailure& failure) {
  const std::string base = "attempt/" + std::to_string(attempt) + "/failure";
  try {
    if (store_->add(key(base + "/count"), 1) == 1) {
      std::ostringstream record;
      record << failure.node_rank << ' ' << failure.global_rank << ' ' << failure.exit_code << ' ' << failure.summary;
      store_->set(key(base), bytes(record.str()));
    }
    store_->add(key(base + "/seen"), 1);
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

void Rendezvous::wait_until_failure_seen(int attempt, std::chrono::milliseconds limit) {
  const std::string seen = key("attempt/" + std::to_string(attempt) + "/failure/seen");
  const auto deadline = std::chrono::steady_clock::now() + limit;
  try {
    while (store_->add(seen, 0) < layout_.num_nodes && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(kPollInterval);
    }
  } catch (const std::exception&) {
    // Only node 0 waits, on its own store: nothing to lose contact with.
  }
}

std::optional<RemoteFailure> Rendezvous::failure(int attempt) {
  const std::string base = key("attempt/" + std::to_string(attempt) + "/failure");
  try {
    if (!store_->check({base})) return std::nullopt;
    std::istringstream record(text(store_->get(base)));
    RemoteFailure failure;
    record >> failure.node_rank >> failure.global_rank >> failure.exit_code;
    std::getline(record >> std::ws, failure.summary);
    if (!failure_seen_.count(attempt)) {
      failure_seen_.insert(attempt);
      store_->add(key("attempt/" + std::to_string(attempt) + "/failure/seen"), 1);
    }
    return failure;
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

void Rendezvous::wait_for_attempt(int attempt) {
  const std::string name = key("attempt/" + std::to_string(attempt) + "/ready");
  try {
    store_->add(name, 1);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (store_->add(name, 0) < layout_.num_nodes) {
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

void Rendezvous::announce_done(int attempt) {
  try {
    store_->add(key("attempt/" + std::to_string(attempt) + "/done"), 1);
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

bool Rendezvous::all_done(int attempt) {
  try {
    return store_->add(key("attempt/" + std::to_string(attempt) + "/done"), 0) >= layout_.num_nodes;
  } catch (const std::exception& error) {
    lost_contact(error);
  }
}

}  // namespace lightning::launcher
