// A worker's end of the store relay (store_relay.h): a c10d::Store whose every call is one
// request to the node's lightning-run and one response.
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <mutex>
#include <thread>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/internal/store_relay.h"
#include "store_relay_wire.h"

namespace lightning::fabric::internal {
namespace {

using namespace relay_wire;
using Clock = std::chrono::steady_clock;

// Beyond a call's own wait, how long a relay may take to answer it: the relay's calls to the main
// store are bounded by lightning-run's --rdzv-timeout (120 s by default).
constexpr std::chrono::milliseconds kAnswerSlack(std::chrono::seconds(180));

class RelayedStore : public c10d::Store {
 public:
  RelayedStore(std::string address, std::chrono::milliseconds timeout) : Store(timeout), address_(std::move(address)) {
    const auto deadline = Clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      LF_CHECK(fd_ >= 0, RuntimeError, "The store relay: socket() failed: ", std::strerror(errno));
      sockaddr_un name{};
      const socklen_t length = abstract_address(address_, name);
      if (::connect(fd_, reinterpret_cast<sockaddr*>(&name), length) == 0) return;
      const int error = errno;
      ::close(fd_);
      fd_ = -1;
      LF_CHECK(Clock::now() < deadline, RuntimeError, "The store relay '", address_, "' of this node's lightning-run "
               "did not answer within ", timeout.count(), " ms (", std::strerror(error), "): the launcher is gone, or "
               "LT_STORE_RELAY was inherited by a process lightning-run did not start; unset it to use the main store.");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(100));
    }
  }
  ~RelayedStore() override {
    if (fd_ >= 0) ::close(fd_);
  }

  c10::intrusive_ptr<c10d::Store> clone() override { return c10::make_intrusive<RelayedStore>(address_, timeout_); }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    call(Writer().u8(static_cast<uint8_t>(Op::Set)).text(key).bytes(value.data(), value.size()), {key});
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    const std::string payload = call(Writer()
                                         .u8(static_cast<uint8_t>(Op::CompareSet))
                                         .text(key)
                                         .bytes(expected.data(), expected.size())
                                         .bytes(desired.data(), desired.size()),
                                     {key});
    return to_bytes(Reader(payload).text());
  }
  std::vector<uint8_t> get(const std::string& key) override {
    const std::string payload =
        call(Writer().u8(static_cast<uint8_t>(Op::Get)).i64(timeout_.count()).text(key), {key}, timeout_);
    return to_bytes(Reader(payload).text());
  }
  int64_t add(const std::string& key, int64_t value) override {
    return Reader(call(Writer().u8(static_cast<uint8_t>(Op::Add)).text(key).i64(value), {key})).i64();
  }
  bool deleteKey(const std::string& key) override {
    return Reader(call(Writer().u8(static_cast<uint8_t>(Op::Delete)).text(key), {key})).u8() != 0;
  }
  bool check(const std::vector<std::string>& keys) override {
    return Reader(call(Writer().u8(static_cast<uint8_t>(Op::Check)).texts(keys), keys)).u8() != 0;
  }
  int64_t getNumKeys() override { return Reader(call(Writer().u8(static_cast<uint8_t>(Op::NumKeys)), {})).i64(); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    call(Writer().u8(static_cast<uint8_t>(Op::Wait)).i64(timeout.count()).texts(keys), keys, timeout);
  }
  void append(const std::string& key, const std::vector<uint8_t>& value) override {
    call(Writer().u8(static_cast<uint8_t>(Op::Append)).text(key).bytes(value.data(), value.size()), {key});
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    const std::string payload =
        call(Writer().u8(static_cast<uint8_t>(Op::MultiGet)).i64(timeout_.count()).texts(keys), keys, timeout_);
    std::vector<std::vector<uint8_t>> values;
    for (const auto& value : Reader(payload).texts()) values.push_back(to_bytes(value));
    return values;
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override {
    LF_CHECK(keys.size() == values.size(), ValueError, "Store multiSet: ", keys.size(), " keys but ", values.size(),
             " values.");
    Writer request;
    request.u8(static_cast<uint8_t>(Op::MultiSet)).texts(keys).u32(static_cast<uint32_t>(values.size()));
    for (const auto& value : values) request.bytes(value.data(), value.size());
    call(request, keys);
  }
  bool hasExtendedApi() const override { return true; }

 private:
  // One request and its response: the reply's fields after the status byte. Throws c10's
  // DistStoreError (as TCPStore does) on a timeout, a relay's error, or a lost relay.
  //
  // waits: how long the relay may hold this call (a get's or wait's timeout; 0: for ever). The
  // answer must come within that and kAnswerSlack, or the call fails instead of hanging.
  std::string call(const Writer& request, const std::vector<std::string>& keys,
                   std::chrono::milliseconds waits = std::chrono::milliseconds(1)) {
    std::string body;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (fd_ < 0) {
        C10_THROW_ERROR(DistStoreError, "The store relay '" + address_ + "': this connection was closed after an "
                                        "answer that did not come in time.");
      }
      const auto limit = waits.count() > 0 ? waits + kAnswerSlack : std::chrono::milliseconds(0);
      timeval receive{static_cast<time_t>(limit.count() / 1000), static_cast<suseconds_t>(limit.count() % 1000 * 1000)};
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &receive, sizeof(receive));
      uint32_t size = 0;
      const bool answered = send_all(fd_, request.frame()) && recv_exact(fd_, &size, sizeof(size)) && size > 0 &&
                            (body.assign(size, '\0'), recv_exact(fd_, body.data(), size));
      if (!answered && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        ::close(fd_);  // a late answer must not be read as the next call's
        fd_ = -1;
        C10_THROW_ERROR(DistStoreError, "The store relay '" + address_ + "' of this node's lightning-run did not "
                                        "answer within " + std::to_string(limit.count()) + " ms: the job's main store "
                                        "is out of reach.");
      }
      if (!answered) {
        C10_THROW_ERROR(DistStoreError, "The store relay '" + address_ + "' of this node's lightning-run closed the "
                                        "connection: the launcher is ending the job or is gone.");
      }
    }
    const auto status = static_cast<Status>(body[0]);
    if (status == Status::Ok) return body.substr(1);
    const std::string rest = body.substr(1);
    Reader reply(rest);
    std::string names;
    for (size_t i = 0; i < keys.size() && i < 4; ++i) names += (i ? ", " : "") + keys[i];
    if (keys.size() > 4) names += ", ... (" + std::to_string(keys.size()) + " keys)";
    const std::string message = reply.text();
    if (status == Status::Timeout) C10_THROW_ERROR(DistStoreError, "wait timeout " + message + ", keys: " + names);
    C10_THROW_ERROR(DistStoreError, "The store relay: " + message + " (keys: " + names + ")");
  }

  std::string address_;
  int fd_ = -1;
  std::mutex mutex_;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_store_relay(const std::string& address, std::chrono::milliseconds timeout) {
  return c10::make_intrusive<RelayedStore>(address, timeout);
}

}  // namespace lightning::fabric::internal
