#include "lightning/fabric/storage/node_memory.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric::storage {

namespace env = fabric::env;

namespace {
// One request or answer is one packet (SOCK_SEQPACKET keeps their bounds): an operation letter, then
// the key; a put carries the object's descriptor, a get's answer the held one.
//   request: 'P' key (+fd) | 'G' key | 'L' folder | 'X' key (exists) | 'R' key
//   answer:  'O' text (+fd for a get: text is the size) | 'E' why
// A list's text is "name\tsize\n" per object.
constexpr size_t kMaxPacket = 200 * 1024;
// Each side's send buffer, asked for so that a packet of kMaxPacket fits whatever
// net.core.wmem_default is (the kernel caps it at net.core.wmem_max, 208 KB by default, and doubles it).
constexpr int kSendBuffer = 256 * 1024;

void size_send_buffer(int socket) { ::setsockopt(socket, SOL_SOCKET, SO_SNDBUF, &kSendBuffer, sizeof(kSendBuffer)); }

std::string why() { return std::strerror(errno); }

socklen_t abstract_name(const std::string& name, sockaddr_un& address) {
  std::memset(&address, 0, sizeof(address));
  address.sun_family = AF_UNIX;
  const size_t size = std::min(name.size(), sizeof(address.sun_path) - 1);
  std::memcpy(address.sun_path + 1, name.data(), size);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + size);
}

// Sends one packet, with fd attached when >= 0; false when the peer is gone.
bool send_packet(int socket, const std::string& text, int fd) {
  iovec part{const_cast<char*>(text.data()), text.size()};
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  }
  for (;;) {
    if (::sendmsg(socket, &message, MSG_NOSIGNAL) >= 0) return true;
    if (errno != EINTR) return false;
  }
}

// Receives one packet into *text and its descriptor into *fd (-1 without one); false when the peer
// is gone. A packet cut short (larger than kMaxPacket) is an error answer of its own.
bool receive_packet(int socket, std::string* text, int* fd) {
  text->assign(kMaxPacket, '\0');
  iovec part{text->data(), text->size()};
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  ssize_t got;
  do {
    got = ::recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  *fd = -1;
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr; header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS) std::memcpy(fd, CMSG_DATA(header), sizeof(int));
  }
  if (got <= 0) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
    return false;
  }
  text->resize(static_cast<size_t>(got));
  if ((message.msg_flags & MSG_TRUNC) != 0) *text = "Epacket larger than " + std::to_string(kMaxPacket) + " bytes";
  return true;
}

// Whether fd's bytes live in memory: a memfd or a file of a tmpfs such as /dev/shm.
bool in_memory(int fd) {
  struct statfs info {};
  return ::fstatfs(fd, &info) == 0 && (info.f_type == TMPFS_MAGIC || info.f_type == HUGETLBFS_MAGIC);
}

int64_t size_of(int fd) {
  struct stat info {};
  return ::fstat(fd, &info) == 0 ? static_cast<int64_t>(info.st_size) : -1;
}

int new_memory_file() {
  const int fd = ::memfd_create("lightning-memory-object", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  LF_CHECK(fd >= 0, RuntimeError, "memory://: memfd_create failed: ", why());
  return fd;
}

// A memory file written whole: no process holding it may change it from now on.
void seal(int fd) { ::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL); }

void write_all(int fd, const char* data, size_t size, const std::string& what) {
  while (size > 0) {
    const ssize_t wrote = ::write(fd, data, size);
    if (wrote < 0 && errno == EINTR) continue;
    LF_CHECK(wrote > 0, RuntimeError, what, ": writing to memory failed: ", why(),
             " (is the machine out of memory? --in-memory-replicas holds the state in RAM)");
    data += wrote;
    size -= static_cast<size_t>(wrote);
  }
}

// Copies `size` bytes of `from` (from its start) to `to`.
void copy_file(int from, int to, int64_t size, const std::string& what) {
  off_t offset = 0;
  while (offset < size) {
    const ssize_t moved = ::sendfile(to, from, &offset, static_cast<size_t>(size - offset));
    if (moved < 0 && errno == EINTR) continue;
    LF_CHECK(moved > 0, RuntimeError, what, ": copying failed: ", why());
  }
}
}  // namespace

// ---- the server ----

struct NodeMemoryServer::Impl {
  struct Held {
    int fd = -1;
    int64_t size = 0;
  };
  std::string address;
  std::string staging;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::vector<int> clients;
  std::map<std::string, Held> objects;
  std::atomic<int64_t> bytes{0};
  std::thread thread;

  ~Impl() {
    std::error_code ignored;
    if (!staging.empty()) std::filesystem::remove_all(staging, ignored);
    for (int fd : clients) ::close(fd);
    for (auto& [key, held] : objects) ::close(held.fd);
    if (listen_fd >= 0) ::close(listen_fd);
    for (int fd : wake)
      if (fd >= 0) ::close(fd);
  }

  void drop(const std::string& key) {
    auto found = objects.find(key);
    if (found == objects.end()) return;
    ::close(found->second.fd);
    bytes -= found->second.size;
    objects.erase(found);
  }

  // One request; the answer goes back on `client`. false when it could not be sent (the caller
  // then drops the connection, so the client fails rather than waits).
  bool serve(int client, const std::string& request, int fd) {
    auto fail = [&](const std::string& text) {
      if (fd >= 0) ::close(fd);
      return send_packet(client, "E" + text, -1);
    };
    if (request.empty()) return fail("an empty request");
    const char op = request[0];
    const std::string key = request.substr(1);
    if (op == 'P') {
      if (fd < 0) return fail("a put without its object");
      if (!in_memory(fd)) return fail("the object is not in memory (neither a memfd nor a file of a tmpfs)");
      const int64_t size = size_of(fd);
      if (size < 0) return fail("cannot read the object's size: " + why());
      drop(key);
      objects[key] = Held{fd, size};
      bytes += size;
      return send_packet(client, "O", -1);
    }
    if (fd >= 0) ::close(fd);
    fd = -1;
    if (op == 'X') return send_packet(client, objects.count(key) ? "O1" : "O0", -1);
    if (op == 'G') {
      auto found = objects.find(key);
      if (found == objects.end()) return fail("no such object in this node's memory");
      return send_packet(client, "O" + std::to_string(found->second.size), found->second.fd);
    }
    if (op == 'R') {
      drop(key);
      return send_packet(client, "O", -1);
    }
    if (op == 'L') {
      const std::string prefix = key.empty() ? std::string() : key + "/";
      std::string listing = "O";
      for (auto it = objects.lower_bound(prefix); it != objects.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
        listing += it->first.substr(prefix.size()) + "\t" + std::to_string(it->second.size) + "\n";
      if (listing.size() > kMaxPacket) return fail("the listing of '" + key + "' is larger than " + std::to_string(kMaxPacket) + " bytes");
      return send_packet(client, listing, -1);
    }
    return fail(std::string("an unknown operation '") + op + "'");
  }

  void loop() {
    for (;;) {
      std::vector<pollfd> fds{{wake[0], POLLIN, 0}, {listen_fd, POLLIN, 0}};
      for (int client : clients) fds.push_back({client, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        for (int client : clients) ::close(client);  // the workers fail at once rather than wait
        clients.clear();
        return;
      }
      if (fds[0].revents != 0) return;
      if ((fds[1].revents & POLLIN) != 0) {
        const int client = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        ucred peer{};
        socklen_t length = sizeof(peer);
        if (client >= 0) {
          // Only this user's processes reach the objects (the socket's name is visible to the host).
          if (::getsockopt(client, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0 && peer.uid == ::getuid()) {
            size_send_buffer(client);
            clients.push_back(client);
          } else {
            ::close(client);
          }
        }
      }
      std::vector<int> gone;
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        std::string request;
        int fd = -1;
        if (!receive_packet(fds[i].fd, &request, &fd)) {
          gone.push_back(fds[i].fd);
          continue;
        }
        if (!serve(fds[i].fd, request, fd)) gone.push_back(fds[i].fd);
      }
      for (int client : gone) {
        ::close(client);
        clients.erase(std::find(clients.begin(), clients.end(), client));
      }
    }
  }
};

namespace {
constexpr const char* kServerPrefix = "lightning-run-memory-";

// The staging folders of this user's servers that were killed before they could remove theirs.
void remove_orphaned_staging() {
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kServerPrefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + std::strlen(kServerPrefix), nullptr, 10);
    struct stat info {};
    if (pid <= 0 || ::stat(entry.path().c_str(), &info) != 0 || info.st_uid != ::getuid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) std::filesystem::remove_all(entry.path(), ignored);
  }
}
}  // namespace

NodeMemoryServer::NodeMemoryServer() : impl_(std::make_shared<Impl>()) {
  remove_orphaned_staging();
  std::random_device entropy;
  impl_->address = kServerPrefix + std::to_string(::getpid()) + "-" + std::to_string(entropy());
  const std::string staging = "/dev/shm/" + impl_->address;
  LF_CHECK(::mkdir(staging.c_str(), 0700) == 0, RuntimeError, "lightning-run --in-memory-replicas: cannot make ", staging,
           ": ", why(), " (the snapshots are staged in /dev/shm: is it mounted and writable?)");
  impl_->staging = staging;
  impl_->listen_fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un name{};
  const socklen_t length = abstract_name(impl_->address, name);
  LF_CHECK(impl_->listen_fd >= 0 && ::bind(impl_->listen_fd, reinterpret_cast<sockaddr*>(&name), length) == 0 &&
               ::listen(impl_->listen_fd, 1024) == 0,
           RuntimeError, "lightning-run --in-memory-replicas: cannot listen on the node's memory socket: ", why());
  LF_CHECK(::pipe2(impl_->wake, O_CLOEXEC) == 0, RuntimeError, "lightning-run --in-memory-replicas: pipe2 failed: ", why());
  impl_->thread = std::thread([impl = impl_.get()] { impl->loop(); });
}

NodeMemoryServer::~NodeMemoryServer() {
  const char stop = 1;
  (void)!::write(impl_->wake[1], &stop, 1);
  if (impl_->thread.joinable()) impl_->thread.join();
}

const std::string& NodeMemoryServer::address() const { return impl_->address; }

const std::string& NodeMemoryServer::staging_folder() const { return impl_->staging; }

void NodeMemoryServer::clear_staging() const {
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator(impl_->staging, ignored))
    std::filesystem::remove_all(entry.path(), ignored);
}

std::string NodeMemoryClient::staging_base() {
  const char* staging = std::getenv(env::kNodeMemoryStaging);
  return staging != nullptr && *staging != '\0' ? std::string(staging) : std::string("/dev/shm");
}

int64_t NodeMemoryServer::bytes_held() const { return impl_->bytes.load(); }

// ---- the client ----

NodeMemoryClient::NodeMemoryClient(const std::string& address, const std::string& who) : who_(who) {
  socket_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un name{};
  const socklen_t length = abstract_name(address, name);
  if (socket_ >= 0) size_send_buffer(socket_);
  if (socket_ < 0 || ::connect(socket_, reinterpret_cast<sockaddr*>(&name), length) != 0) {
    const std::string reason = why();
    if (socket_ >= 0) ::close(socket_);
    throw RuntimeError(who + ": cannot reach this node's lightning-run memory at '" + address + "' (LT_NODE_MEMORY): " +
                       reason + ". Is the lightning-run that started this worker still running?");
  }
}

NodeMemoryClient::~NodeMemoryClient() {
  if (socket_ >= 0) ::close(socket_);
}

std::shared_ptr<const NodeMemoryClient> NodeMemoryClient::from_environment(const std::string& who) {
  static std::mutex made;
  static std::shared_ptr<const NodeMemoryClient> client;
  static std::string address;
  const char* value = std::getenv(env::kNodeMemory);
  LF_CHECK(value != nullptr && *value != '\0', ValueError, who, ": memory:// objects live in the memory of the node's ",
           "lightning-run, and this process was not started by `lightning-run model --in-memory-replicas K ...` ",
           "(LT_NODE_MEMORY is unset). Start the job that way, or save to a local path or s3://.");
  std::lock_guard<std::mutex> lock(made);
  if (!client || address != value) {
    // Shared by every caller: its errors name the object, and the callers add what they were doing.
    try {
      client = std::make_shared<const NodeMemoryClient>(value, "lightning-run's node memory");
    } catch (const RuntimeError& error) {
      throw RuntimeError(who + ": " + error.what());
    }
    address = value;
  }
  return client;
}

std::string NodeMemoryClient::call(const std::string& request, int fd_out, int* fd_in, const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string answer;
  int received = -1;
  errno = 0;
  if (!send_packet(socket_, request, fd_out) || !receive_packet(socket_, &answer, &received))
    throw RuntimeError(who_ + ": " + url(key) + ": this node's lightning-run memory stopped answering (" +
                       (errno != 0 ? why() : std::string("connection closed")) + ")");
  if (fd_in != nullptr) {
    *fd_in = received;
  } else if (received >= 0) {
    ::close(received);
  }
  if (!answer.empty() && answer[0] == 'O') return answer.substr(1);
  if (received >= 0 && fd_in != nullptr) ::close(received), *fd_in = -1;
  throw RuntimeError(who_ + ": " + url(key) + ": " + (answer.size() > 1 ? answer.substr(1) : std::string("refused")));
}

void NodeMemoryClient::put_fd(const std::string& key, int fd) const { call("P" + key, fd, nullptr, key); }

int NodeMemoryClient::get_fd(const std::string& key, int64_t* size) const {
  int fd = -1;
  const std::string text = call("G" + key, -1, &fd, key);
  LF_CHECK(fd >= 0, RuntimeError, who_, ": ", url(key), ": the answer carried no object");
  *size = std::strtoll(text.c_str(), nullptr, 10);
  return fd;
}

std::string NodeMemoryClient::get(const std::string& key) const {
  int64_t size = 0;
  const int fd = get_fd(key, &size);
  std::string bytes(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const std::string reason = got < 0 ? why() : "it is shorter than its size";
      ::close(fd);
      throw RuntimeError(who_ + ": " + url(key) + ": reading it failed: " + reason);
    }
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  return bytes;
}

int64_t NodeMemoryClient::get_to_file(const std::string& key, const std::filesystem::path& path) const {
  int64_t size = 0;
  const int from = get_fd(key, &size);
  const std::filesystem::path partial = path.string() + ".part";
  const int to = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (to < 0) {
    const std::string reason = why();
    ::close(from);
    throw RuntimeError(who_ + ": cannot write " + partial.string() + " to read " + url(key) + " into: " + reason);
  }
  try {
    copy_file(from, to, size, who_ + ": " + url(key));
  } catch (...) {
    ::close(from);
    ::close(to);
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw;
  }
  ::close(from);
  ::close(to);
  std::filesystem::rename(partial, path);
  return size;
}

void NodeMemoryClient::put(const std::string& key, std::string_view bytes) const {
  const int fd = new_memory_file();
  try {
    write_all(fd, bytes.data(), bytes.size(), who_ + ": " + url(key));
    seal(fd);
    put_fd(key, fd);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

void NodeMemoryClient::put_file(const std::string& key, const std::filesystem::path& file) const {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  LF_CHECK(fd >= 0, RuntimeError, who_, ": cannot read ", file.string(), " to keep it as ", url(key), ": ", why());
  int held = fd;
  try {
    const int64_t size = size_of(fd);
    LF_CHECK(size >= 0, RuntimeError, who_, ": cannot read the size of ", file.string(), ": ", why());
    if (!in_memory(fd)) {  // a file on disk: its bytes copied into memory first
      held = new_memory_file();
      copy_file(fd, held, size, who_ + ": " + url(key));
      seal(held);
    }
    put_fd(key, held);
  } catch (...) {
    ::close(fd);
    if (held != fd) ::close(held);
    throw;
  }
  ::close(fd);
  if (held != fd) ::close(held);
}

std::map<std::string, int64_t> NodeMemoryClient::list_folder(const std::string& folder) const {
  const std::string text = call("L" + folder, -1, nullptr, folder);
  std::map<std::string, int64_t> objects;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at);
    const size_t tab = text.find('\t', at);
    if (end == std::string::npos || tab == std::string::npos || tab > end) break;
    objects[text.substr(at, tab - at)] = std::strtoll(text.c_str() + tab + 1, nullptr, 10);
    at = end + 1;
  }
  return objects;
}

bool NodeMemoryClient::exists(const std::string& key) const { return call("X" + key, -1, nullptr, key) == "1"; }

void NodeMemoryClient::remove(const std::string& key) const { call("R" + key, -1, nullptr, key); }

}  // namespace lightning::fabric::storage
