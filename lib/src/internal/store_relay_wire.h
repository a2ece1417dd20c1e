// The store relay's frames (store_relay.h): a u32 length, then the body. A request's body is an
// op byte and its fields; a response's body is a status byte and its fields. Strings are a u32
// length and bytes; integers are host order (both ends run on one machine).
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace lightning::fabric::internal::relay_wire {

enum class Op : uint8_t { Set = 1, Get, Add, Check, MultiGet, MultiSet, Wait, Delete, CompareSet, NumKeys, Append };
enum class Status : uint8_t { Ok = 0, Timeout = 1, Error = 2 };

/// Appends fields to a body.
class Writer {
 public:
  Writer& u8(uint8_t value) { return raw(&value, 1); }
  Writer& u32(uint32_t value) { return raw(&value, sizeof(value)); }
  Writer& i64(int64_t value) { return raw(&value, sizeof(value)); }
  Writer& bytes(const void* data, size_t size) { return u32(static_cast<uint32_t>(size)).raw(data, size); }
  Writer& text(const std::string& value) { return bytes(value.data(), value.size()); }
  Writer& texts(const std::vector<std::string>& values) {
    u32(static_cast<uint32_t>(values.size()));
    for (const auto& value : values) text(value);
    return *this;
  }
  Writer& append(const Writer& other) { return raw(other.body_.data(), other.body_.size()); }
  /// The whole frame: length, then body.
  std::string frame() const {
    std::string out(sizeof(uint32_t), '\0');
    const auto size = static_cast<uint32_t>(body_.size());
    std::memcpy(out.data(), &size, sizeof(size));
    return out + body_;
  }

 private:
  Writer& raw(const void* data, size_t size) {
    body_.append(static_cast<const char*>(data), size);
    return *this;
  }
  std::string body_;
};

/// Reads fields from a body; throws std::runtime_error past its end (a torn or foreign frame).
class Reader {
 public:
  explicit Reader(const std::string& body) : at_(body.data()), end_(body.data() + body.size()) {}
  uint8_t u8() { return scalar<uint8_t>(); }
  uint32_t u32() { return scalar<uint32_t>(); }
  int64_t i64() { return scalar<int64_t>(); }
  std::string text() {
    const uint32_t size = u32();
    need(size);
    std::string value(at_, size);
    at_ += size;
    return value;
  }
  std::vector<std::string> texts() {
    const uint32_t count = u32();
    std::vector<std::string> values;
    values.reserve(count);
    for (uint32_t i = 0; i < count; ++i) values.push_back(text());
    return values;
  }

 private:
  template <typename T>
  T scalar() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  void need(size_t size) const {
    if (static_cast<size_t>(end_ - at_) < size) throw std::runtime_error("the store relay: a malformed frame");
  }
  const char* at_;
  const char* end_;
};

inline std::vector<uint8_t> to_bytes(const std::string& text) { return {text.begin(), text.end()}; }
inline std::string to_text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

/// The abstract socket `name` (no file: a leading NUL byte, then the name).
inline socklen_t abstract_address(const std::string& name, sockaddr_un& address) {
  std::memset(&address, 0, sizeof(address));
  address.sun_family = AF_UNIX;
  const size_t size = std::min(name.size(), sizeof(address.sun_path) - 1);
  std::memcpy(address.sun_path + 1, name.data(), size);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + size);
}

/// Writes all of data (blocking); false when the peer is gone.
inline bool send_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t sent = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    done += static_cast<size_t>(sent);
  }
  return true;
}

/// Reads exactly size bytes (blocking); false when the peer is gone.
inline bool recv_exact(int fd, void* out, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t got = ::recv(fd, static_cast<char*>(out) + done, size - done, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

}  // namespace lightning::fabric::internal::relay_wire
