#include "lightning/launcher/status.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "lightning/launcher/args.h"

namespace lightning::launcher {

std::string status_requests_key() { return "lightning-run/status/requests"; }

std::string status_answer_key(int64_t request, const std::string& what) {
  return "lightning-run/status/" + std::to_string(request) + "/" + what;
}

bool is_status_command(int argc, const char* const* argv) { return argc >= 2 && std::string(argv[1]) == "status"; }

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "Usage: lightning-run status HOST:PORT [--timeout SECONDS]\n"
    "Prints where every rank of a running job is: its optimizer step, the collective it is in or last\n"
    "left and when, and its native stack. The job goes on. HOST:PORT is the job's rendezvous, which\n"
    "lightning-run prints when it starts (\"rendezvous at HOST:PORT\"); PORT defaults to 29400.\n"
    "--timeout: how long to wait for every node's answer (default 10 seconds).\n";

struct StatusArgs {
  std::string host;
  int port = kDefaultMainPort;
  double timeout_s = 10;
};

// A bad command line: exit code 2.
struct UsageProblem : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The job cannot be asked or did not answer: exit code 1.
struct Unreachable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string address_text(const StatusArgs& args) {
  const bool v6 = args.host.find(':') != std::string::npos;
  return (v6 ? "[" + args.host + "]" : args.host) + ":" + std::to_string(args.port);
}

void parse_address(const std::string& word, StatusArgs& args) {
  std::string host = word;
  std::optional<std::string> port;
  if (!word.empty() && word.front() == '[') {  // [v6]:port
    const size_t close = word.find(']');
    if (close == std::string::npos) throw UsageProblem("'" + word + "' is not an address: an IPv6 one is written [::1]:29400.");
    host = word.substr(1, close - 1);
    if (close + 1 < word.size()) {
      if (word[close + 1] != ':') throw UsageProblem("'" + word + "' is not an address: write [HOST]:PORT.");
      port = word.substr(close + 2);
    }
  } else if (const size_t colon = word.rfind(':'); colon != std::string::npos && word.find(':') == colon) {
    host = word.substr(0, colon);
    port = word.substr(colon + 1);
  }
  if (host.empty()) throw UsageProblem("'" + word + "' names no host: give HOST:PORT, e.g. 127.0.0.1:29400.");
  args.host = host;
  if (!port) return;
  char* end = nullptr;
  const long value = std::strtol(port->c_str(), &end, 10);
  if (port->empty() || *end != '\0' || value < 1 || value > 65535) {
    throw UsageProblem("port '" + *port + "' in '" + word + "' is not valid: give a number from 1 to 65535 (the job's --main-port, "
                       "printed as \"rendezvous at HOST:PORT\").");
  }
  args.port = static_cast<int>(value);
}

StatusArgs parse(int argc, const char* const* argv, std::ostream& out, bool& help) {
  StatusArgs args;
  std::optional<std::string> address;
  for (int i = 2; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "-h" || word == "--help") {
      out << kUsage;
      help = true;
      return args;
    }
    std::optional<std::string> timeout;
    if (word == "--timeout") {
      if (i + 1 >= argc) throw UsageProblem("--timeout needs a number of seconds, e.g. --timeout 10.");
      timeout = argv[++i];
    } else if (word.rfind("--timeout=", 0) == 0) {
      timeout = word.substr(10);
    } else if (word.rfind("-", 0) == 0) {
      throw UsageProblem("unknown flag " + word + ": the flags are --timeout SECONDS and --help.");
    } else if (address) {
      throw UsageProblem("one address only, got '" + *address + "' and '" + word + "'.");
    } else {
      address = word;
    }
    if (timeout) {
      char* end = nullptr;
      args.timeout_s = std::strtod(timeout->c_str(), &end);
      if (timeout->empty() || *end != '\0' || !(args.timeout_s > 0) || args.timeout_s > 3600) {
        throw UsageProblem("--timeout=" + *timeout + " is not valid: give seconds, more than 0 and at most 3600 (default 10).");
      }
    }
  }
  if (!address) {
    throw UsageProblem("lightning-run status needs the job's address: lightning-run status HOST:PORT (lightning-run prints it "
                       "when the job starts: \"rendezvous at HOST:PORT\").");
  }
  parse_address(*address, args);
  return args;
}

// Connects a plain socket first, so that a job that has ended (nothing listens) and a host that
// does not answer are told apart at once and within the timeout, before the store's own retries.
void probe(const StatusArgs& args, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(args.port);
  if (const int code = ::getaddrinfo(args.host.c_str(), port.c_str(), &hints, &found); code != 0) {
    throw Unreachable("cannot resolve host '" + args.host + "': " + ::gai_strerror(code) + ".");
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);
  std::string failure;
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int fd = ::socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, address->ai_protocol);
    if (fd < 0) continue;
    int error = 0;
    if (::connect(fd, address->ai_addr, address->ai_addrlen) != 0) {
      error = errno;
      if (error == EINPROGRESS) {
        pollfd entry{fd, POLLOUT, 0};
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (::poll(&entry, 1, static_cast<int>(std::max<int64_t>(left, 0))) <= 0) {
          ::close(fd);
          throw Unreachable(address_text(args) + " does not answer (no connection within the --timeout): the host is down or "
                            "unreachable, or a firewall drops the connection.");
        }
        socklen_t length = sizeof(error);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      }
    }
    ::close(fd);
    if (error == 0) return;
    failure = error == ECONNREFUSED
                  ? "nothing listens at " + address_text(args) + ": the job has ended, or this is not its address (lightning-run "
                    "prints it when the job starts: \"rendezvous at HOST:PORT\")."
                  : "cannot reach " + address_text(args) + ": " + std::strerror(error) + ".";
  }
  throw Unreachable(failure.empty() ? "no address of '" + args.host + "' could be tried." : failure);
}

std::string text_of(const std::vector<uint8_t>& data) { return {data.begin(), data.end()}; }

// What the store session found: the job's answer, or why there is none.
struct Answers {
  std::string run_id;
  int nodes = 0;
  std::vector<std::optional<std::string>> texts;  // by node rank; nullopt: no answer in time
};

bool wait_for_key(c10d::TCPStore& store, const std::string& key, Clock::time_point deadline) {
  while (!store.check({key})) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// c10d's messages carry a C++ backtrace after their first line.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

Answers ask(const StatusArgs& args, Clock::time_point deadline) {
  probe(args, deadline);
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) throw Unreachable(address_text(args) + " did not answer within the --timeout.");
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(args.port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = left;
  std::optional<c10d::TCPStore> connected;
  try {
    connected.emplace(args.host, options);
  } catch (const std::exception& error) {
    throw Unreachable(address_text(args) + " accepted the connection but did not answer as a store within the --timeout (" +
                      first_line(error.what()) + "): it is not a lightning-run job's rendezvous, or the job is overloaded.");
  }
  c10d::TCPStore& store = *connected;
  Answers answers;
  if (!store.check({"lightning-run/run_id"})) {
    throw Unreachable(address_text(args) + " is a store but not a lightning-run job's rendezvous (it has no lightning-run/run_id): "
                      "only jobs started by lightning-run answer `lightning-run status`.");
  }
  answers.run_id = text_of(store.get("lightning-run/run_id"));
  const int64_t request = store.add(status_requests_key(), 1);
  if (!wait_for_key(store, status_answer_key(request, "nodes"), deadline)) {
    throw Unreachable("the job at " + address_text(args) + " did not answer within the --timeout: node 0's lightning-run is "
                      "between two starts of the workers (a restart, an elastic round), or its machine is overloaded.");
  }
  answers.nodes = std::atoi(text_of(store.get(status_answer_key(request, "nodes"))).c_str());
  for (int node = 0; node < answers.nodes; ++node) {
    const std::string key = status_answer_key(request, "node/" + std::to_string(node));
    answers.texts.push_back(wait_for_key(store, key, deadline) ? std::optional(text_of(store.get(key))) : std::nullopt);
  }
  // The answers stay in node 0's memory otherwise, one set per look, for the life of the job.
  store.deleteKey(status_answer_key(request, "nodes"));
  for (int node = 0; node < answers.nodes; ++node) store.deleteKey(status_answer_key(request, "node/" + std::to_string(node)));
  return answers;
}

}  // namespace

int run_status_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  StatusArgs args;
  try {
    bool help = false;
    args = parse(argc, argv, out, help);
    if (help) return 0;
  } catch (const UsageProblem& problem) {
    err << "lightning-run status: " << problem.what() << "\n" << kUsage;
    return 2;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));
  try {
    // The name lookup, the connection and the store's calls block in the kernel; a peer that accepts but never answers (not a store)
    // must not hold this command past the deadline, so they run on a thread of their own.
    auto session = std::make_shared<std::packaged_task<Answers()>>([args, deadline] { return ask(args, deadline); });
    std::future<Answers> result = session->get_future();
    std::thread([session] { (*session)(); }).detach();
    if (result.wait_until(deadline + std::chrono::seconds(1)) != std::future_status::ready) {
      err << "lightning-run status: " << address_text(args) << " accepted the connection but did not answer as a store within "
          << "the --timeout: it is not a lightning-run job's rendezvous, or the job is overloaded." << std::endl;
      out.flush();
      std::_Exit(1);  // the session's thread is still blocked in the store; nothing to clean up
    }
    const Answers answers = result.get();
    out << "lightning-run status: job " << answers.run_id << " at " << address_text(args) << ", " << answers.nodes
        << (answers.nodes == 1 ? " node" : " nodes") << "\n";
    int missing = 0;
    for (int node = 0; node < answers.nodes; ++node) {
      if (answers.texts[static_cast<size_t>(node)]) {
        out << *answers.texts[static_cast<size_t>(node)];
      } else {
        ++missing;
        out << "node " << node << ": no answer within the --timeout (its lightning-run is between two starts of the workers, "
            << "or its machine or network is down)\n";
      }
    }
    out.flush();
    return missing == 0 ? 0 : 1;
  } catch (const Unreachable& problem) {
    err << "lightning-run status: " << problem.what() << std::endl;
    return 1;
  } catch (const std::exception& error) {
    // The connection broke after the store answered: node 0's lightning-run has gone.
    err << "lightning-run status: the job at " << address_text(args) << " went away while answering (it ended or its "
        << "lightning-run on node 0 stopped): " << first_line(error.what()) << std::endl;
    return 1;
  }
}

}  // namespace lightning::launcher
