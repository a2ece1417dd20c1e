#include "lightning/fabric/internal/wait_for_listener.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <thread>

namespace lightning::fabric::internal {
namespace {

// One non-blocking connect to any address of host:port, bounded by wait.
bool try_connect(const std::string& host, int port, std::chrono::milliseconds wait) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool connected = false;
  for (addrinfo* address = found; address != nullptr && !connected; address = address->ai_next) {
    const int fd = ::socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, address->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, address->ai_addr, address->ai_addrlen) == 0) {
      connected = true;
    } else if (errno == EINPROGRESS) {
      pollfd descriptor{fd, POLLOUT, 0};
      int error = 0;
      socklen_t length = sizeof(error);
      connected = ::poll(&descriptor, 1, static_cast<int>(wait.count())) == 1 &&
                  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return connected;
}

}  // namespace

bool wait_for_listener(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(10);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    if (try_connect(host, port, std::min(left, std::chrono::milliseconds(1000)))) return true;
    std::this_thread::sleep_for(std::min(pause, left));
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

}  // namespace lightning::fabric::internal
