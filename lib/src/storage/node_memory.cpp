#include "lightning/fabric/storage/node_memory.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
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

// ---- between nodes: framed requests over TCP ----
namespace {
// A request: op (1 byte), key length (4), payload length (8), the key, the payload. An answer:
// status 'O' or 'E' (1 byte), payload length (8), the payload (an object's bytes, a listing, or why).
// Lengths are little-endian. A connection opens with 'H' and the job's token as its key.
//   'H' token | 'C' key + bytes (a copy of the sender's object) | 'R' key (drop that copy)
//   'G' key (the object held here) | 'X' key | 'L' folder (what is held here, own and copies)
constexpr double kPeerIoTimeoutS = 60;     // one request's send or answer
constexpr double kPeerConnectTimeoutS = 3;  // a node that does not accept by then is taken as lost
constexpr int kCopyAttempts = 5;  // tries of one copy to the buddy, 200 ms to 1.6 s apart

void put_le(char* at, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) at[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}
uint64_t get_le(const char* at, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(static_cast<unsigned char>(at[i])) << (8 * i);
  return value;
}

bool send_all(int socket, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t sent = ::send(socket, data, size, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    data += sent;
    size -= static_cast<size_t>(sent);
  }
  return true;
}

bool receive_all(int socket, char* data, size_t size) {
  while (size > 0) {
    const ssize_t got = ::recv(socket, data, size, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = ECONNRESET;
      return false;
    }
    data += got;
    size -= static_cast<size_t>(got);
  }
  return true;
}

// Sends `size` bytes of fd (from its start) to the socket.
bool send_file(int socket, int fd, int64_t size) {
  off_t offset = 0;
  while (offset < size) {
    const ssize_t moved = ::sendfile(socket, fd, &offset, static_cast<size_t>(size - offset));
    if (moved < 0 && errno == EINTR) continue;
    if (moved <= 0) return false;
  }
  return true;
}

bool send_request(int socket, char op, const std::string& key, std::string_view payload, int payload_fd = -1, int64_t fd_size = 0) {
  char header[13];
  header[0] = op;
  put_le(header + 1, key.size(), 4);
  put_le(header + 5, payload_fd >= 0 ? static_cast<uint64_t>(fd_size) : payload.size(), 8);
  if (!send_all(socket, header, sizeof(header)) || !send_all(socket, key.data(), key.size())) return false;
  return payload_fd >= 0 ? send_file(socket, payload_fd, fd_size) : send_all(socket, payload.data(), payload.size());
}

bool send_answer(int socket, char status, std::string_view payload, int payload_fd = -1, int64_t fd_size = 0) {
  char header[9];
  header[0] = status;
  put_le(header + 1, payload_fd >= 0 ? static_cast<uint64_t>(fd_size) : payload.size(), 8);
  if (!send_all(socket, header, sizeof(header))) return false;
  return payload_fd >= 0 ? send_file(socket, payload_fd, fd_size) : send_all(socket, payload.data(), payload.size());
}

void set_io_timeout(int socket, double seconds) {
  timeval limit{static_cast<time_t>(seconds), static_cast<suseconds_t>((seconds - static_cast<time_t>(seconds)) * 1e6)};
  ::setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  ::setsockopt(socket, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  const int on = 1;
  ::setsockopt(socket, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

// A connection to "host:port" that said hello with `token`; -1 with *error set when it cannot be
// made within kPeerConnectTimeoutS.
int connect_peer(const std::string& endpoint, const std::string& token, std::string* error) {
  const size_t colon = endpoint.rfind(':');
  std::string host = endpoint.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port = colon == std::string::npos ? "" : endpoint.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int code = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); code != 0) {
    *error = "cannot resolve " + endpoint + ": " + ::gai_strerror(code);
    return -1;
  }
  int result = -1;
  *error = "nothing answered at " + endpoint;
  for (addrinfo* at = found; at != nullptr && result < 0; at = at->ai_next) {
    const int socket = ::socket(at->ai_family, at->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, at->ai_protocol);
    if (socket < 0) continue;
    int code = ::connect(socket, at->ai_addr, at->ai_addrlen);
    if (code != 0 && errno == EINPROGRESS) {
      pollfd wait{socket, POLLOUT, 0};
      code = -1;
      if (::poll(&wait, 1, static_cast<int>(kPeerConnectTimeoutS * 1000)) == 1) {
        int failure = 0;
        socklen_t length = sizeof(failure);
        ::getsockopt(socket, SOL_SOCKET, SO_ERROR, &failure, &length);
        code = failure == 0 ? 0 : -1;
        errno = failure == 0 ? ETIMEDOUT : failure;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (code != 0) {
      *error = "cannot connect to " + endpoint + ": " + why();
      ::close(socket);
      continue;
    }
    ::fcntl(socket, F_SETFL, ::fcntl(socket, F_GETFL) & ~O_NONBLOCK);
    set_io_timeout(socket, kPeerIoTimeoutS);
    if (!send_request(socket, 'H', token, {})) {
      *error = "cannot greet " + endpoint + ": " + why();
      ::close(socket);
      continue;
    }
    result = socket;
  }
  ::freeaddrinfo(found);
  return result;
}

// The next `size` bytes of the socket in a new sealed memory file, or -1 (nothing kept) when the
// connection failed before they all came, or no memory file of that size could be made: a torn
// transfer never becomes an object, and a peer's bad size never ends this process. The bytes go
// from the socket straight into the file's pages (one copy).
int receive_to_memory_file(int socket, uint64_t size) {
  const int fd = ::memfd_create("lightning-memory-object", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (size > 0) {
    void* pages = size <= static_cast<uint64_t>(std::numeric_limits<off_t>::max()) &&
                          ::ftruncate(fd, static_cast<off_t>(size)) == 0
                      ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                      : MAP_FAILED;
    const bool whole = pages != MAP_FAILED && receive_all(socket, static_cast<char*>(pages), size);
    if (pages != MAP_FAILED) ::munmap(pages, size);
    if (!whole) {
      ::close(fd);
      return -1;
    }
  }
  seal(fd);
  return fd;
}

// One answer: its status, with the payload in *text, or (for an 'O' of a get, when to_memory) in a
// new sealed memory file *fd. false when the connection failed.
bool receive_answer(int socket, char* status, std::string* text, int* fd, int64_t* size) {
  char header[9];
  if (!receive_all(socket, header, sizeof(header))) return false;
  *status = header[0];
  *size = static_cast<int64_t>(get_le(header + 1, 8));
  if (fd == nullptr || *status != 'O') {
    if (*size < 0 || *size > (int64_t{1} << 30)) return false;  // no listing or message is this large
    text->assign(static_cast<size_t>(*size), '\0');
    return receive_all(socket, text->data(), text->size());
  }
  *fd = receive_to_memory_file(socket, static_cast<uint64_t>(*size));
  return *fd >= 0;
}

std::string listing_text(const std::map<std::string, int64_t>& listing) {
  std::string text;
  for (const auto& [name, size] : listing) text += name + "\t" + std::to_string(size) + "\n";
  return text;
}

void parse_listing(const std::string& text, std::map<std::string, int64_t>* into) {
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at);
    const size_t tab = text.find('\t', at);
    if (end == std::string::npos || tab == std::string::npos || tab > end) break;
    into->emplace(text.substr(at, tab - at), std::strtoll(text.c_str() + tab + 1, nullptr, 10));
    at = end + 1;
  }
}
}  // namespace

// ---- the server ----

struct NodeMemoryServer::Impl {
  struct Held {
    int fd = -1;
    int64_t size = 0;
  };
  // A put or remove of this node's, to be copied to the buddy in order.
  struct CopyOp {
    bool put = true;
    std::string key;
    int fd = -1;  // a put's own descriptor (dup), closed once sent
    int64_t size = 0;
  };
  std::string address;
  std::string staging;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::vector<int> clients;
  std::thread thread;

  mutable std::mutex lock;  // guards everything below
  std::map<std::string, Held> objects;  // put by this node's workers
  std::map<std::string, Held> copies;   // other nodes' objects: copies sent here, and ones fetched for a read
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> copied_bytes{0};
  std::atomic<int64_t> peak_bytes{0};  // the most bytes held at once, own and copies
  void note_peak() {
    const int64_t now = bytes.load() + copied_bytes.load();
    int64_t seen = peak_bytes.load();
    while (now > seen && !peak_bytes.compare_exchange_weak(seen, now)) {
    }
  }
  std::vector<std::string> peers;  // the other nodes' endpoints
  std::string buddy;               // where this node's objects are copied; empty: nowhere
  std::string token;
  std::deque<CopyOp> queue;
  int in_flight = 0;
  std::string copy_error;  // why copying to the buddy stopped; empty while it works
  uint64_t generation = 0;  // bumped by set_peers: the copier reconnects
  bool stopping = false;
  std::condition_variable queue_changed;
  std::thread copier;
  int peer_listen_fd = -1;
  std::thread peer_acceptor;
  std::vector<std::thread> peer_threads;
  std::vector<int> peer_sockets;
  int buddy_socket = -1;

  ~Impl() {
    stop_peers();
    std::error_code ignored;
    if (!staging.empty()) std::filesystem::remove_all(staging, ignored);
    for (int fd : clients) ::close(fd);
    for (auto& [key, held] : objects) ::close(held.fd);
    for (auto& [key, held] : copies) ::close(held.fd);
    for (auto& op : queue)
      if (op.fd >= 0) ::close(op.fd);
    if (listen_fd >= 0) ::close(listen_fd);
    for (int fd : wake)
      if (fd >= 0) ::close(fd);
  }

  void stop_peers() {
    {
      std::lock_guard<std::mutex> guard(lock);
      stopping = true;
      if (peer_listen_fd >= 0) ::shutdown(peer_listen_fd, SHUT_RDWR);
      for (int socket : peer_sockets) ::shutdown(socket, SHUT_RDWR);
      if (buddy_socket >= 0) ::shutdown(buddy_socket, SHUT_RDWR);
    }
    queue_changed.notify_all();
    if (copier.joinable()) copier.join();
    if (peer_acceptor.joinable()) peer_acceptor.join();
    for (auto& served : peer_threads)
      if (served.joinable()) served.join();
    if (peer_listen_fd >= 0) ::close(peer_listen_fd);
    if (buddy_socket >= 0) ::close(buddy_socket);
  }

  static void drop_from(std::map<std::string, Held>& held, std::atomic<int64_t>& counter, const std::string& key) {
    auto found = held.find(key);
    if (found == held.end()) return;
    ::close(found->second.fd);
    counter -= found->second.size;
    held.erase(found);
  }

  // Under lock: queues a copy of this node's change for the buddy.
  void queue_copy(bool put, const std::string& key, int fd, int64_t size) {
    if (buddy.empty()) return;
    queue.push_back({put, key, put ? ::fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1, size});
    queue_changed.notify_all();
  }

  // Under lock: the object's descriptor (dup, the caller closes it) held here, own or a copy; -1.
  int held_fd(const std::string& key, int64_t* size) const {
    for (const auto* held : {&objects, &copies}) {
      const auto found = held->find(key);
      if (found == held->end()) continue;
      *size = found->second.size;
      return ::fcntl(found->second.fd, F_DUPFD_CLOEXEC, 0);
    }
    return -1;
  }

  // Under lock: what is held here under `folder` (own and copies), by name relative to it.
  std::map<std::string, int64_t> local_listing(const std::string& folder) const {
    const std::string prefix = folder.empty() ? std::string() : folder + "/";
    std::map<std::string, int64_t> listing;
    for (const auto* held : {&objects, &copies}) {
      for (auto it = held->lower_bound(prefix); it != held->end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
        listing.emplace(it->first.substr(prefix.size()), it->second.size);
    }
    return listing;
  }

  // One request to each other node, in node order, until `answered` says done; returns whether it did.
  // Nodes that do not answer are skipped (lost).
  template <typename Answered>
  void ask_peers(char op, const std::string& key, bool want_file, Answered answered) {
    std::vector<std::string> others;
    std::string job_token;
    {
      std::lock_guard<std::mutex> guard(lock);
      others = peers;
      job_token = token;
    }
    for (const std::string& peer : others) {
      std::string error;
      const int socket = connect_peer(peer, job_token, &error);
      if (socket < 0) continue;
      char status = 'E';
      std::string text;
      int fd = -1;
      int64_t size = 0;
      const bool ok = send_request(socket, op, key, {}) && receive_answer(socket, &status, &text, want_file ? &fd : nullptr, &size);
      ::close(socket);
      if (ok && answered(status, text, fd, size)) return;
      if (fd >= 0) ::close(fd);
    }
  }

  // The object's descriptor (the caller closes it): held here, or fetched from another node and
  // kept here as a copy; -1 when no node has it.
  int find_object(const std::string& key, int64_t* size) {
    {
      std::lock_guard<std::mutex> guard(lock);
      const int fd = held_fd(key, size);
      if (fd >= 0 || peers.empty()) return fd;
    }
    int result = -1;
    ask_peers('G', key, /*want_file=*/true, [&](char status, const std::string&, int fd, int64_t got) {
      if (status != 'O' || fd < 0) return false;
      std::lock_guard<std::mutex> guard(lock);
      drop_from(copies, copied_bytes, key);
      copies[key] = Held{fd, got};
      copied_bytes += got;
      note_peak();
      *size = got;
      result = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      return true;
    });
    return result;
  }

  // One request of a worker of this node; the answer goes back on `client`. false when it could not
  // be sent (the caller then drops the connection, so the client fails rather than waits).
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
      {
        std::lock_guard<std::mutex> guard(lock);
        drop_from(objects, bytes, key);
        objects[key] = Held{fd, size};
        bytes += size;
        note_peak();
        queue_copy(true, key, fd, size);
      }
      return send_packet(client, "O", -1);
    }
    if (fd >= 0) ::close(fd);
    fd = -1;
    if (op == 'X') {
      int64_t size = 0;
      const int held = find_held_or_listed(key, &size);
      return send_packet(client, held ? "O1" : "O0", -1);
    }
    if (op == 'G') {
      int64_t size = 0;
      const int found = find_object(key, &size);
      if (found < 0) return fail(peers_empty() ? "no such object in this node's memory" : "no such object in the memory of any node");
      const bool sent = send_packet(client, "O" + std::to_string(size), found);
      ::close(found);
      return sent;
    }
    if (op == 'R') {
      std::lock_guard<std::mutex> guard(lock);
      drop_from(objects, bytes, key);
      drop_from(copies, copied_bytes, key);
      queue_copy(false, key, -1, 0);
      return send_packet(client, "O", -1);
    }
    if (op == 'L') {
      std::map<std::string, int64_t> listing;
      {
        std::lock_guard<std::mutex> guard(lock);
        listing = local_listing(key);
      }
      ask_peers('L', key, false, [&](char status, const std::string& text, int, int64_t) {
        if (status == 'O') parse_listing(text, &listing);
        return false;  // every node
      });
      const std::string text = "O" + listing_text(listing);
      if (text.size() > kMaxPacket) return fail("the listing of '" + key + "' is larger than " + std::to_string(kMaxPacket) + " bytes");
      return send_packet(client, text, -1);
    }
    if (op == 'W') {  // copied? "O1" when nothing waits to go to the buddy
      std::lock_guard<std::mutex> guard(lock);
      if (!copy_error.empty()) return fail(copy_error);
      return send_packet(client, queue.empty() && in_flight == 0 ? "O1" : "O0", -1);
    }
    if (op == 'D') {  // key: prefix '\n' keep
      const size_t newline = key.find('\n');
      if (newline == std::string::npos) return fail("a drop without what to keep");
      const std::string prefix = key.substr(0, newline), keep = key.substr(newline + 1);
      std::lock_guard<std::mutex> guard(lock);
      for (auto* held : {&objects, &copies}) {
        auto& counter = held == &objects ? bytes : copied_bytes;
        for (auto it = held->lower_bound(prefix); it != held->end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
          const std::string& name = it->first;
          if (name < keep && name != keep && name.rfind(keep + "/", 0) != 0) {
            ::close(it->second.fd);
            counter -= it->second.size;
            it = held->erase(it);
          } else {
            ++it;
          }
        }
      }
      return send_packet(client, "O", -1);
    }
    return fail(std::string("an unknown operation '") + op + "'");
  }

  bool peers_empty() const {
    std::lock_guard<std::mutex> guard(lock);
    return peers.empty();
  }

  // Whether any node holds the object (exists).
  bool find_held_or_listed(const std::string& key, int64_t* size) {
    {
      std::lock_guard<std::mutex> guard(lock);
      const int fd = held_fd(key, size);
      if (fd >= 0) {
        ::close(fd);
        return true;
      }
    }
    bool found = false;
    ask_peers('X', key, false, [&](char status, const std::string& text, int, int64_t) {
      found = status == 'O' && text == "1";
      return found;
    });
    return found;
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

  // ---- the copier: this node's changes to the buddy, in order ----
  void copy_loop() {
    std::unique_lock<std::mutex> guard(lock);
    uint64_t connected_generation = 0;
    for (;;) {
      queue_changed.wait(guard, [&] { return stopping || !queue.empty(); });
      if (stopping) return;
      CopyOp op = std::move(queue.front());
      queue.pop_front();
      ++in_flight;
      const std::string target = buddy, job_token = token;
      const uint64_t op_generation = generation;
      int socket = buddy_socket;
      guard.unlock();
      std::string error;
      if (socket >= 0 && connected_generation != op_generation) {
        ::close(socket);
        socket = -1;
      }
      // A buddy that is starting, or a connection that broke, gets a few more tries (about 3 s).
      bool ok = false;
      for (int attempt = 0; attempt < kCopyAttempts && !ok; ++attempt) {
        if (attempt > 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100 << attempt));
          std::lock_guard<std::mutex> check(lock);
          if (stopping || generation != op_generation) break;
        }
        if (socket < 0) {
          socket = connect_peer(target, job_token, &error);
          std::lock_guard<std::mutex> connected(lock);
          buddy_socket = socket;  // stop_peers shuts it down to end a send that waits
        }
        if (socket < 0) continue;
        char status = 'E';
        std::string text;
        int64_t size = 0;
        ok = send_request(socket, op.put ? 'C' : 'R', op.key, {}, op.put ? op.fd : -1, op.size) &&
             receive_answer(socket, &status, &text, nullptr, &size);
        if (!ok) error = "the connection to " + target + " failed: " + why();
        if (ok && status != 'O') ok = false, error = target + " refused it: " + text;
        if (!ok) ::close(socket), socket = -1;
      }
      if (op.fd >= 0) ::close(op.fd);
      guard.lock();
      --in_flight;
      buddy_socket = socket;
      connected_generation = op_generation;
      if (!ok && generation == op_generation) {
        copy_error = "copying " + op.key + " to the buddy node failed (" + error + ")";
        for (auto& dropped : queue)
          if (dropped.fd >= 0) ::close(dropped.fd);
        queue.clear();
      }
    }
  }

  // ---- serving the other nodes ----
  void accept_loop() {
    for (;;) {
      const int socket = ::accept4(peer_listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      std::lock_guard<std::mutex> guard(lock);
      if (stopping) {
        if (socket >= 0) ::close(socket);
        return;
      }
      if (socket < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      set_io_timeout(socket, kPeerIoTimeoutS);
      peer_sockets.push_back(socket);
      peer_threads.emplace_back([this, socket] { serve_peer(socket); });
    }
  }

  // Reads one request's header and key; false when the connection ended.
  static bool receive_request(int socket, char* op, std::string* key, uint64_t* payload) {
    char header[13];
    if (!receive_all(socket, header, sizeof(header))) return false;
    *op = header[0];
    const uint64_t key_size = get_le(header + 1, 4);
    *payload = get_le(header + 5, 8);
    if (key_size > 64 * 1024) return false;
    key->assign(key_size, '\0');
    return receive_all(socket, key->data(), key->size());
  }

  void serve_peer(int socket) {
    char op = 0;
    std::string key;
    uint64_t payload = 0;
    std::string job_token;
    {
      std::lock_guard<std::mutex> guard(lock);
      job_token = token;
    }
    // The first request greets with the job's token: a stranger's connection is closed unanswered.
    bool greeted = receive_request(socket, &op, &key, &payload) && op == 'H' && payload == 0 && !job_token.empty() && key == job_token;
    while (greeted && receive_request(socket, &op, &key, &payload)) {
      bool ok = true;
      if (op == 'C') {
        const int fd = receive_to_memory_file(socket, payload);
        if (fd < 0) break;
        {
          std::lock_guard<std::mutex> guard(lock);
          drop_from(copies, copied_bytes, key);
          copies[key] = Held{fd, static_cast<int64_t>(payload)};
          copied_bytes += static_cast<int64_t>(payload);
          note_peak();
        }
        ok = send_answer(socket, 'O', {});
      } else if (payload != 0) {
        break;  // only a copy carries bytes
      } else if (op == 'R') {
        {
          std::lock_guard<std::mutex> guard(lock);
          drop_from(copies, copied_bytes, key);
        }
        ok = send_answer(socket, 'O', {});
      } else if (op == 'G') {
        int64_t size = 0;
        int fd = -1;
        {
          std::lock_guard<std::mutex> guard(lock);
          fd = held_fd(key, &size);
        }
        ok = fd >= 0 ? send_answer(socket, 'O', {}, fd, size) : send_answer(socket, 'E', "not held here");
        if (fd >= 0) ::close(fd);
      } else if (op == 'X') {
        int64_t size = 0;
        int fd = -1;
        {
          std::lock_guard<std::mutex> guard(lock);
          fd = held_fd(key, &size);
        }
        if (fd >= 0) ::close(fd);
        ok = send_answer(socket, 'O', fd >= 0 ? "1" : "0");
      } else if (op == 'L') {
        std::string text;
        {
          std::lock_guard<std::mutex> guard(lock);
          text = listing_text(local_listing(key));
        }
        ok = send_answer(socket, 'O', text);
      } else {
        ok = send_answer(socket, 'E', std::string("an unknown operation '") + op + "'");
      }
      if (!ok) break;
    }
    std::lock_guard<std::mutex> guard(lock);
    peer_sockets.erase(std::find(peer_sockets.begin(), peer_sockets.end(), socket));
    ::close(socket);
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

int64_t NodeMemoryServer::copied_bytes_held() const { return impl_->copied_bytes.load(); }

int64_t NodeMemoryServer::peak_bytes_held() const { return impl_->peak_bytes.load(); }

int NodeMemoryServer::listen_for_peers(const std::string& token) {
  Impl& impl = *impl_;
  LF_CHECK(!token.empty(), ValueError, "NodeMemoryServer::listen_for_peers: an empty token");
  {
    std::lock_guard<std::mutex> guard(impl.lock);
    impl.token = token;  // before the first connection can arrive
  }
  LF_CHECK(impl.peer_listen_fd < 0, RuntimeError, "NodeMemoryServer::listen_for_peers: already listening");
  // Both address families where the host has IPv6 (a dual-stack socket), else IPv4.
  int socket = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1, off = 0;
  sockaddr_storage any{};
  socklen_t length = 0;
  if (socket >= 0) {
    ::setsockopt(socket, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&any);
    v6->sin6_family = AF_INET6;
    v6->sin6_addr = in6addr_any;
    length = sizeof(sockaddr_in6);
    if (::bind(socket, reinterpret_cast<sockaddr*>(&any), length) != 0) ::close(socket), socket = -1;
  }
  if (socket < 0) {
    socket = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    any = {};
    auto* v4 = reinterpret_cast<sockaddr_in*>(&any);
    v4->sin_family = AF_INET;
    v4->sin_addr.s_addr = htonl(INADDR_ANY);
    length = sizeof(sockaddr_in);
    LF_CHECK(socket >= 0 && ::bind(socket, reinterpret_cast<sockaddr*>(&any), length) == 0, RuntimeError,
             "lightning-run --in-memory-replicas: cannot open a port for the other nodes' copies: ", why());
  }
  ::setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  LF_CHECK(::listen(socket, 128) == 0, RuntimeError, "lightning-run --in-memory-replicas: listen failed: ", why());
  length = sizeof(any);
  ::getsockname(socket, reinterpret_cast<sockaddr*>(&any), &length);
  const int port = any.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&any)->sin6_port)
                                             : ntohs(reinterpret_cast<sockaddr_in*>(&any)->sin_port);
  impl.peer_listen_fd = socket;
  impl.peer_acceptor = std::thread([&impl] { impl.accept_loop(); });
  return port;
}

void NodeMemoryServer::set_peers(int self, const std::vector<std::string>& endpoints) {
  Impl& impl = *impl_;
  std::lock_guard<std::mutex> guard(impl.lock);
  if (!impl.copier.joinable()) impl.copier = std::thread([&impl] { impl.copy_loop(); });
  impl.peers.clear();
  for (size_t node = 0; node < endpoints.size(); ++node)
    if (static_cast<int>(node) != self) impl.peers.push_back(endpoints[node]);
  impl.buddy = endpoints.size() > 1 ? endpoints[(static_cast<size_t>(self) + 1) % endpoints.size()] : std::string();
  ++impl.generation;
  if (impl.buddy_socket >= 0) ::shutdown(impl.buddy_socket, SHUT_RDWR);  // a send to the old buddy ends now
  impl.copy_error.clear();
  for (auto& op : impl.queue)
    if (op.fd >= 0) ::close(op.fd);
  impl.queue.clear();
  // A new buddy (or the first) gets everything this node holds of its own.
  for (const auto& [key, held] : impl.objects) impl.queue_copy(true, key, held.fd, held.size);
}

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
  parse_listing(text, &objects);
  return objects;
}

void NodeMemoryClient::wait_until_copied(double timeout_s) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (auto pause = std::chrono::microseconds(200);; pause = std::min(pause * 2, std::chrono::microseconds(20000))) {
    if (call("W", -1, nullptr, "") == "1") return;
    LF_CHECK(std::chrono::steady_clock::now() < deadline, RuntimeError, who_, ": this node's objects were not copied to its ",
             "buddy node within ", timeout_s, " s (is the network to it slow or down?)");
    std::this_thread::sleep_for(pause);
  }
}

void NodeMemoryClient::drop_before(const std::string& prefix, const std::string& keep) const {
  call("D" + prefix + "\n" + keep, -1, nullptr, prefix);
}

bool NodeMemoryClient::exists(const std::string& key) const { return call("X" + key, -1, nullptr, key) == "1"; }

void NodeMemoryClient::remove(const std::string& key) const { call("R" + key, -1, nullptr, key); }

}  // namespace lightning::fabric::storage
