// The agent's end of the store relay (store_relay.h). One thread: it accepts workers, reads what
// they sent, sends it upstream batched, and answers. Waits (get, multiGet, wait) are held until
// their keys exist: one check of every waited key per round finds the common case (keys that
// appear together, e.g. every rank's address) in one request; when it fails, each wait is checked
// alone on its own backoff, as the worker would poll by itself.
#include "lightning/fabric/internal/store_relay.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/internal/store_chunks.h"
#include "store_relay_wire.h"

namespace lightning::fabric::internal {
namespace {

using namespace relay_wire;
using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

constexpr Millis kFirstRound(1);   // after new requests
constexpr Millis kSlowestRound(50);
constexpr Millis kSlowestAloneCheck(500);
constexpr size_t kAloneChecksPerRound = 4;  // bounds what a relay with many unrelated waits costs the store
// Requests that come within this long of each other go upstream together: ranks of one node
// publish their hang-watch progress at the same tick, and each would otherwise cost the main
// store a request of its own.
constexpr Millis kGatherWindow(3);
constexpr Millis kStopWait(200);

struct Request {
  int client = -1;
  Op op = Op::Set;
  std::vector<std::string> keys;
  std::vector<std::string> values;  // Set, MultiSet, Append: one per key; CompareSet: expected, desired
  int64_t amount = 0;               // Add
  Millis timeout{0};                // Get, MultiGet, Wait
  bool answered = false;
};

struct Held {  // a wait for keys that did not all exist yet
  Request request;
  Clock::time_point deadline;
  Clock::time_point next_alone_check;
  Millis alone_backoff{2};
};

// An upstream failure in one line (c10's errors carry a backtrace).
std::string failure_text(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

Request parse_request(int client, const std::string& body) {
  Reader in(body);
  Request request;
  request.client = client;
  request.op = static_cast<Op>(in.u8());
  switch (request.op) {
    case Op::Set:
    case Op::Append:
      request.keys = {in.text()};
      request.values = {in.text()};
      break;
    case Op::Get:
      request.timeout = Millis(in.i64());
      request.keys = {in.text()};
      break;
    case Op::Add:
      request.keys = {in.text()};
      request.amount = in.i64();
      break;
    case Op::Check:
      request.keys = in.texts();
      break;
    case Op::MultiGet:
    case Op::Wait:
      request.timeout = Millis(in.i64());
      request.keys = in.texts();
      break;
    case Op::MultiSet:
      request.keys = in.texts();
      request.values = in.texts();
      if (request.values.size() != request.keys.size()) throw std::runtime_error("the store relay: a malformed multiSet");
      break;
    case Op::Delete:
      request.keys = {in.text()};
      break;
    case Op::CompareSet:
      request.keys = {in.text()};
      request.values = {in.text(), in.text()};
      break;
    case Op::NumKeys:
      break;
    default:
      throw std::runtime_error("the store relay: an unknown request");
  }
  return request;
}

}  // namespace

struct StoreRelay::Impl {
  c10::intrusive_ptr<c10d::Store> upstream;
  std::string address;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::thread thread;
  std::mutex ending;  // guards finished and abandoned
  std::condition_variable ended;
  bool finished = false;
  bool abandoned = false;
  std::atomic<int64_t> client_requests{0};
  std::atomic<int64_t> upstream_requests{0};
  std::map<int, std::string> unread;  // per worker: bytes read that are not yet a whole frame
  std::set<int> gone;                  // workers whose connection closed during this round
  std::vector<Held> held;
  std::string broken;  // the main store's failure: every later request gets it
  Millis round{kFirstRound};
  bool new_waits = false;  // this batch held a wait: look at once
  Clock::time_point next_round = Clock::now();

  void start() {
    static std::atomic<int> made{0};
    if (address.empty()) address = "lightning-run-relay-" + std::to_string(::getpid()) + "-" + std::to_string(made++);
    listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un name{};
    const socklen_t length = abstract_address(address, name);
    LF_CHECK(listen_fd >= 0 && ::bind(listen_fd, reinterpret_cast<sockaddr*>(&name), length) == 0 &&
                 ::listen(listen_fd, 4096) == 0,
             RuntimeError, "The store relay could not listen on '", address, "': ", std::strerror(errno));
    LF_CHECK(::pipe2(wake, O_CLOEXEC) == 0, RuntimeError, "The store relay: pipe2 failed: ", std::strerror(errno));
  }

  // The thread holds the Impl alive: a relay whose main store went silent (a cut link) may be
  // blocked in a call up to its timeout, and stop() does not wait for that.
  static void run(const std::shared_ptr<Impl>& self) {
    self->thread = std::thread([self] {
      self->loop();
      for (const auto& entry : self->unread) ::close(entry.first);
      if (self->listen_fd >= 0) ::close(self->listen_fd);
      std::lock_guard<std::mutex> lock(self->ending);
      self->finished = true;
      if (self->abandoned) {  // stop() gave up waiting: the wake pipe is this thread's to close
        ::close(self->wake[0]);
        ::close(self->wake[1]);
      }
      self->ended.notify_all();
    });
  }

  // Wakes the thread and waits for it up to kStopWait; a thread still blocked upstream then ends
  // on its own (its workers are being stopped anyway).
  void stop() {
    const char byte = 0;
    (void)!::write(wake[1], &byte, 1);
    std::unique_lock<std::mutex> lock(ending);
    if (ended.wait_for(lock, kStopWait, [this] { return finished; })) {
      lock.unlock();
      thread.join();
      ::close(wake[0]);
      ::close(wake[1]);
      return;
    }
    abandoned = true;
    thread.detach();
  }

  // --- answers ---------------------------------------------------------------------------------
  void answer(Request& request, Status status, const Writer& fields) {
    request.answered = true;
    if (gone.count(request.client) != 0) return;
    if (!send_all(request.client, Writer().u8(static_cast<uint8_t>(status)).append(fields).frame())) {
      gone.insert(request.client);
    }
  }
  void answer_ok(Request& request, const Writer& fields = Writer()) { answer(request, Status::Ok, fields); }
  void answer_error(Request& request, const std::string& message) {
    answer(request, Status::Error, Writer().text(message));
  }

  // One call to the main store; `keys`: how many keys it names (chunked calls count one request
  // per chunk).
  template <typename Call>
  auto upstream_call(Call call, size_t keys = 1) {
    upstream_requests += static_cast<int64_t>(std::max<size_t>(1, (keys + kStoreChunk - 1) / kStoreChunk));
    return call(*upstream);
  }

  // --- one batch of requests that arrived together ----------------------------------------------
  void execute(std::vector<Request>& batch) {
    try {
      forward_writes(batch);
      forward_adds(batch);
      forward_checks(batch);
      for (auto& request : batch) {
        if (request.answered) continue;
        switch (request.op) {
          case Op::Get:
          case Op::MultiGet:
          case Op::Wait: {
            // c10d's timeout 0 (kNoTimeout) waits for ever.
            const auto deadline =
                request.timeout.count() > 0 ? Clock::now() + request.timeout : Clock::time_point::max();
            Held wait{request, deadline, Clock::now()};
            request.answered = true;  // answered when its keys exist (serve_held)
            held.push_back(std::move(wait));
            new_waits = true;
            break;
          }
          case Op::Delete: {
            const bool deleted = upstream_call([&](c10d::Store& s) { return s.deleteKey(request.keys[0]); });
            answer_ok(request, Writer().u8(deleted ? 1 : 0));
            break;
          }
          case Op::CompareSet: {
            const auto value = upstream_call([&](c10d::Store& s) {
              return s.compareSet(request.keys[0], to_bytes(request.values[0]), to_bytes(request.values[1]));
            });
            answer_ok(request, Writer().bytes(value.data(), value.size()));
            break;
          }
          case Op::Append:
            upstream_call([&](c10d::Store& s) { s.append(request.keys[0], to_bytes(request.values[0])); return 0; });
            answer_ok(request);
            break;
          case Op::NumKeys:
            answer_ok(request, Writer().i64(upstream_call([](c10d::Store& s) { return s.getNumKeys(); })));
            break;
          default:
            answer_error(request, "an unexpected request");
        }
      }
    } catch (const std::exception& error) {
      fail_all(batch, failure_text(error));
    }
  }

  // Every set of the batch as one multiSet, in arrival order (the last of two writes to one key wins,
  // as if they had come in that order).
  void forward_writes(std::vector<Request>& batch) {
    std::vector<std::string> keys;
    std::vector<std::vector<uint8_t>> values;
    for (const auto& request : batch) {
      if (request.op != Op::Set && request.op != Op::MultiSet) continue;
      for (size_t i = 0; i < request.keys.size(); ++i) keys.push_back(request.keys[i]), values.push_back(to_bytes(request.values[i]));
    }
    if (keys.empty()) return;
    if (keys.size() == 1) {
      upstream_call([&](c10d::Store& s) { s.set(keys[0], values[0]); return 0; });
    } else {
      upstream_call([&](c10d::Store& s) { multi_set_in_chunks(s, keys, values); return 0; }, keys.size());
    }
    for (auto& request : batch) {
      if (request.op == Op::Set || request.op == Op::MultiSet) answer_ok(request);
    }
  }

  // The adds to one key as one add of their sum; each caller gets the value after its own add in
  // arrival order, as if they had been sent one after another.
  void forward_adds(std::vector<Request>& batch) {
    std::map<std::string, std::vector<Request*>> by_key;
    for (auto& request : batch) {
      if (request.op == Op::Add) by_key[request.keys[0]].push_back(&request);
    }
    for (auto& [key, adds] : by_key) {
      int64_t total = 0;
      for (const Request* add : adds) total += add->amount;
      const std::string& name = key;
      int64_t running = upstream_call([&](c10d::Store& s) { return s.add(name, total); }) - total;
      for (Request* add : adds) {
        running += add->amount;
        answer_ok(*add, Writer().i64(running));
      }
    }
  }

  // Checks of the same keys as one check; several different ones first as one check of every key
  // they name, and only when that fails, each alone.
  void forward_checks(std::vector<Request>& batch) {
    std::map<std::vector<std::string>, std::vector<Request*>> by_keys;
    for (auto& request : batch) {
      if (request.op == Op::Check) by_keys[request.keys].push_back(&request);
    }
    if (by_keys.empty()) return;
    std::vector<std::string> every;
    std::set<std::string> seen;
    for (const auto& entry : by_keys) {
      for (const auto& key : entry.first) {
        if (seen.insert(key).second) every.push_back(key);
      }
    }
    const bool all_exist = by_keys.size() > 1 && exist(every);
    for (auto& [keys, checks] : by_keys) {
      const bool found = all_exist || exist(keys);
      for (Request* check : checks) answer_ok(*check, Writer().u8(found ? 1 : 0));
    }
  }

  template <typename Requests>
  static std::vector<std::string> union_of_keys(const Requests& requests) {
    std::set<std::string> seen;
    std::vector<std::string> keys;
    for (const auto& entry : requests) {
      for (const auto& key : keys_of(entry)) {
        if (seen.insert(key).second) keys.push_back(key);
      }
    }
    return keys;
  }
  static const std::vector<std::string>& keys_of(const Request* request) { return request->keys; }
  static const std::vector<std::string>& keys_of(const Held& held) { return held.request.keys; }

  bool exist(const std::vector<std::string>& keys) {
    if (keys.empty()) return true;
    return upstream_call([&](c10d::Store& s) { return check_in_chunks(s, keys); }, keys.size());
  }

  // --- held waits -------------------------------------------------------------------------------
  // A round when one is due or new waits came: one check of every waited key; when that fails,
  // up to kAloneChecksPerRound sets of keys alone.
  void serve_held() {
    if (held.empty()) return;
    const auto now = Clock::now();
    if (new_waits) round = kFirstRound;
    if (!new_waits && now < next_round) {
      expire(now);  // a deadline between rounds
      return;
    }
    new_waits = false;
    try {
      std::vector<bool> ready(held.size(), false);
      if (exist(union_of_keys(held))) {
        ready.assign(held.size(), true);
      } else if (held.size() > 1) {
        std::vector<size_t> due;
        for (size_t i = 0; i < held.size(); ++i) {
          if (now >= held[i].next_alone_check) due.push_back(i);
        }
        // Waits never checked alone first, then the longest unchecked; waits for the same keys
        // share one check.
        std::sort(due.begin(), due.end(), [&](size_t a, size_t b) {
          return std::make_pair(held[a].alone_backoff, held[a].next_alone_check) <
                 std::make_pair(held[b].alone_backoff, held[b].next_alone_check);
        });
        std::map<std::vector<std::string>, bool> checked;
        for (size_t i : due) {
          auto found = checked.find(held[i].request.keys);
          if (found == checked.end()) {
            if (checked.size() >= kAloneChecksPerRound) continue;
            found = checked.emplace(held[i].request.keys, exist(held[i].request.keys)).first;
          }
          ready[i] = found->second;
          held[i].alone_backoff = std::min(held[i].alone_backoff * 2, kSlowestAloneCheck);
          held[i].next_alone_check = now + held[i].alone_backoff;
        }
      }
      std::vector<Held*> reading;
      for (size_t i = 0; i < held.size(); ++i) {
        if (ready[i] && held[i].request.op != Op::Wait) reading.push_back(&held[i]);
      }
      std::map<std::string, std::string> values;
      if (!reading.empty()) {
        std::vector<std::string> keys;
        std::set<std::string> seen;
        for (Held* wait : reading) {
          for (const auto& key : wait->request.keys) {
            if (seen.insert(key).second) keys.push_back(key);
          }
        }
        const auto read = upstream_call([&](c10d::Store& s) { return multi_get_in_chunks(s, keys); }, keys.size());
        for (size_t i = 0; i < keys.size(); ++i) values[keys[i]] = to_text(read[i]);
      }
      std::vector<Held> still;
      for (size_t i = 0; i < held.size(); ++i) {
        Request& request = held[i].request;
        if (ready[i]) {
          Writer fields;
          if (request.op == Op::Get) fields.text(values[request.keys[0]]);
          if (request.op == Op::MultiGet) {
            std::vector<std::string> read;
            for (const auto& key : request.keys) read.push_back(values[key]);
            fields.texts(read);
          }
          answer_ok(request, fields);
        } else if (now >= held[i].deadline) {
          answer(request, Status::Timeout, Writer().text("after " + std::to_string(request.timeout.count()) + "ms"));
        } else {
          still.push_back(std::move(held[i]));
        }
      }
      held = std::move(still);
    } catch (const std::exception& error) {
      broken = failure_text(error);
      for (auto& wait : held) answer_error(wait.request, "the job's main store failed: " + broken);
      held.clear();
    }
    round = std::min(round * 2, kSlowestRound);
    next_round = Clock::now() + round;
  }

  // Answers the waits whose deadline has passed with a timeout.
  void expire(Clock::time_point now) {
    std::vector<Held> still;
    for (auto& wait : held) {
      if (now >= wait.deadline) {
        answer(wait.request, Status::Timeout, Writer().text("after " + std::to_string(wait.request.timeout.count()) + "ms"));
      } else {
        still.push_back(std::move(wait));
      }
    }
    held = std::move(still);
  }

  void fail_all(std::vector<Request>& batch, const std::string& message) {
    broken = message;
    for (auto& request : batch) {
      if (!request.answered) answer_error(request, "the job's main store failed: " + message);
    }
    for (auto& wait : held) answer_error(wait.request, "the job's main store failed: " + message);
    held.clear();
  }

  // --- the loop -----------------------------------------------------------------------------------
  int poll_timeout_ms() const {
    if (held.empty()) return -1;
    auto until = next_round;
    for (const auto& wait : held) until = std::min(until, wait.deadline);
    const auto left = std::chrono::ceil<Millis>(until - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left, 0, kSlowestRound.count()));
  }

  void accept_all() {
    for (;;) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      unread[fd];
    }
  }

  // Reads what worker fd sent; appends its whole frames to batch.
  void read_from(int fd, std::vector<Request>& batch) {
    std::string& buffer = unread[fd];
    char chunk[65536];
    for (;;) {
      const ssize_t got = ::recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
      if (got > 0) {
        buffer.append(chunk, static_cast<size_t>(got));
        continue;
      }
      if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) gone.insert(fd);
      if (got < 0 && errno == EINTR) continue;
      break;
    }
    size_t at = 0;
    while (buffer.size() - at >= sizeof(uint32_t)) {
      uint32_t size = 0;
      std::memcpy(&size, buffer.data() + at, sizeof(size));
      if (buffer.size() - at - sizeof(size) < size) break;
      const std::string body = buffer.substr(at + sizeof(size), size);
      at += sizeof(size) + size;
      ++client_requests;
      try {
        batch.push_back(parse_request(fd, body));
      } catch (const std::exception&) {
        gone.insert(fd);  // not one of ours: drop the connection
        break;
      }
    }
    buffer.erase(0, at);
  }

  // Keeps reading the workers while more requests keep coming (none for 1 ms ends it), for up to
  // kGatherWindow, or until every worker has sent one.
  void gather_more(std::vector<pollfd>& fds, std::vector<Request>& batch) {
    const auto until = Clock::now() + kGatherWindow;
    while (Clock::now() < until && batch.size() < unread.size()) {
      for (auto& fd : fds) fd.revents = 0;
      const auto left = std::chrono::duration_cast<Millis>(until - Clock::now()).count();
      if (::poll(fds.data() + 2, fds.size() - 2, static_cast<int>(std::clamp<int64_t>(left, 0, 1))) <= 0) return;
      const size_t before = batch.size();
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(fds[i].fd, batch);
      }
      if (batch.size() == before) return;
    }
  }

  void close_gone() {
    for (int fd : gone) {
      ::close(fd);
      unread.erase(fd);
      held.erase(std::remove_if(held.begin(), held.end(), [fd](const Held& wait) { return wait.request.client == fd; }),
                 held.end());
    }
    gone.clear();
  }

  void loop() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake[0], POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (const auto& entry : unread) fds.push_back({entry.first, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), poll_timeout_ms()) < 0 && errno != EINTR) return;
      if (fds[0].revents != 0) return;  // stop()
      if (fds[1].revents & POLLIN) accept_all();
      std::vector<Request> batch;
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(fds[i].fd, batch);
      }
      if (!batch.empty() && unread.size() > 1) gather_more(fds, batch);
      if (!broken.empty()) {
        for (auto& request : batch) answer_error(request, "the job's main store failed: " + broken);
      } else if (!batch.empty()) {
        execute(batch);
      }
      if (broken.empty()) serve_held();
      close_gone();
    }
  }
};

StoreRelay::StoreRelay(const std::string& host, int port, std::chrono::milliseconds upstream_timeout,
                       std::string address)
    : impl_(std::make_shared<Impl>()) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = upstream_timeout;
  try {
    impl_->upstream = c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const c10::Error& error) {
    throw RuntimeError("The store relay could not connect to the job's main store at " + host + ":" +
                       std::to_string(port) + ": " + error.what_without_backtrace());
  }
  impl_->address = std::move(address);
  impl_->start();
  Impl::run(impl_);
}

StoreRelay::StoreRelay(c10::intrusive_ptr<c10d::Store> upstream, std::string address) : impl_(std::make_shared<Impl>()) {
  impl_->upstream = std::move(upstream);
  impl_->address = std::move(address);
  impl_->start();
  Impl::run(impl_);
}

StoreRelay::~StoreRelay() { impl_->stop(); }

const std::string& StoreRelay::address() const { return impl_->address; }

StoreRelayCounts StoreRelay::counts() const { return {impl_->client_requests.load(), impl_->upstream_requests.load()}; }

}  // namespace lightning::fabric::internal
