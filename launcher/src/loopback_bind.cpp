// Binds c10d's TCPStore server to loopback for local-only jobs.
//
// c10d::TCPStore always listens on every interface (it has no bind-address option). A single-node job must not be
// reachable from the network, so the launcher interposes bind(): while loopback-only binding is
// enabled, a bind to a wildcard address is rewritten to loopback: 127.0.0.1 for IPv4, and for
// c10d's dual-stack IPv6 socket ::ffff:127.0.0.1 (or ::1 when the main address is IPv6); an IPv4
// wildcard bind in IPv6 mode fails with EADDRNOTAVAIL so that c10d uses the IPv6 one. Every
// other bind, and every bind while disabled, goes to the C library unchanged. The definition lives in
// the executable that links this library, which the dynamic linker prefers over libc's for
// libtorch's calls (exported with --export-dynamic-symbol=bind).
#include <dlfcn.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "lightning/launcher/rendezvous.h"

namespace {
std::atomic<int> loopback_family{AF_UNSPEC};  // AF_UNSPEC: disabled

using BindFunction = int (*)(int, const struct sockaddr*, socklen_t);
BindFunction real_bind() {
  static BindFunction function = reinterpret_cast<BindFunction>(dlsym(RTLD_NEXT, "bind"));
  return function;
}
}  // namespace

namespace lightning::launcher {
void set_loopback_only_binding(int family) { loopback_family = family; }
}  // namespace lightning::launcher

extern "C" __attribute__((visibility("default"))) int bind(int fd, const struct sockaddr* address, socklen_t length) {
  const int family = loopback_family;
  if (family != AF_UNSPEC && address != nullptr) {
    if (address->sa_family == AF_INET && length >= sizeof(sockaddr_in)) {
      sockaddr_in local;
      std::memcpy(&local, address, sizeof(local));
      if (local.sin_addr.s_addr == htonl(INADDR_ANY)) {
        if (family != AF_INET) {
          errno = EADDRNOTAVAIL;
          return -1;
        }
        local.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return real_bind()(fd, reinterpret_cast<const sockaddr*>(&local), sizeof(local));
      }
    } else if (address->sa_family == AF_INET6 && length >= sizeof(sockaddr_in6)) {
      sockaddr_in6 local;
      std::memcpy(&local, address, sizeof(local));
      if (std::memcmp(&local.sin6_addr, &in6addr_any, sizeof(in6_addr)) == 0) {
        if (family == AF_INET6) {
          local.sin6_addr = in6addr_loopback;
        } else {  // the v4-mapped 127.0.0.1: a dual-stack socket then serves IPv4 loopback only
          inet_pton(AF_INET6, "::ffff:127.0.0.1", &local.sin6_addr);
        }
        return real_bind()(fd, reinterpret_cast<const sockaddr*>(&local), sizeof(local));
      }
    }
  }
  return real_bind()(fd, address, length);
}
