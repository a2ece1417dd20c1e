#include "lightning/fabric/internal/published_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "lightning/fabric/errors.h"

namespace lightning::fabric::internal {
namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  LF_CHECK(fd >= 0, RuntimeError, "Could not open a socket to find a free port.");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                     ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  ::close(fd);
  LF_CHECK(bound, RuntimeError, "Could not bind a socket to find a free port.");
  return ntohs(address.sin_port);
}

}  // namespace

int publish_free_port(const std::string& path) {
  const int port = free_port();
  const std::string temporary = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << port << '\n';
    LF_CHECK(static_cast<bool>(out.flush()), RuntimeError, "Could not write the rendezvous port to ", temporary, ".");
  }
  LF_CHECK(std::rename(temporary.c_str(), path.c_str()) == 0, RuntimeError, "Could not publish the rendezvous port as ",
           path, ".");
  return port;
}

int read_published_port(const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    LF_CHECK(std::chrono::steady_clock::now() < deadline, RuntimeError, "Rank 0 did not publish its rendezvous port in ",
             path, " within ", timeout.count() / 1000.0, " s (LT_RENDEZVOUS_TIMEOUT): rank 0 did not start, or failed "
             "before joining. See its output; or export MASTER_PORT to every rank.");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace lightning::fabric::internal
