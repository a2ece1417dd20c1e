#include "lightning/fabric/plugins/collectives/shm_point_to_point.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <random>
#include <cstring>
#include <string>

#include "lightning/fabric/errors.h"

namespace lightning::fabric::internal {
namespace {

constexpr size_t kPageBytes = 4096;
constexpr size_t kPairHeaderBytes = kPageBytes;  // the PairBlock, then the rings
constexpr uint64_t kAlign = 64;
constexpr uint64_t kClaimed = 1;  // a pair-table entry being created; else 0, kGone or (pid << 32 | fd)
constexpr uint64_t kGone = 2;     // its creator left the group before the peer opened it
constexpr uint64_t kMagic = 0x4c462d7032702d31;  // "LF-p2p-1", each message header's first word
constexpr uint64_t kPairMagic = 0x4c462d7061697231;  // "LF-pair1", a pair block's
constexpr size_t kRegionHeaderBytes = 64;  // the group's id, then the doorbells

// One direction of a pair: bytes ever written (the sender's) and ever read (the receiver's).
struct RingCounters {
  alignas(64) std::atomic<uint64_t> written{0};
  alignas(64) std::atomic<uint64_t> read{0};
};

// The start of a pair's memfd; the two rings' bytes follow at kPairHeaderBytes.
struct PairBlock {
  RingCounters way[2];                  // [0]: lower rank to higher, [1]: back
  alignas(64) std::atomic<uint32_t> opened{0};  // the second rank has mapped it
  // What the opener checks before it writes anything: a file found through a table entry that
  // outlived its pair (the creator left, its fd number reused) is never taken for the pair.
  uint64_t magic = 0;
  uint64_t group = 0;  // the group's id (the region's first word)
  int32_t low = -1, high = -1;
};
static_assert(sizeof(PairBlock) <= kPairHeaderBytes);

struct MessageHeader {
  uint64_t magic;
  int64_t tag;
  int64_t dtype;
  int64_t numel;
  uint64_t bytes;
};
static_assert(sizeof(MessageHeader) <= kAlign);

size_t pair_bytes() { return kPairHeaderBytes + 2 * ShmPointToPoint::kRingBytes; }
uint64_t padded(uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

long ring_futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// Copies between a tensor's bytes and a ring, which may wrap at its end.
void to_ring(char* ring, uint64_t at, const char* from, uint64_t bytes) {
  const uint64_t offset = at % ShmPointToPoint::kRingBytes;
  const uint64_t first = std::min<uint64_t>(bytes, ShmPointToPoint::kRingBytes - offset);
  std::memcpy(ring + offset, from, first);
  if (first < bytes) std::memcpy(ring, from + first, bytes - first);
}
void from_ring(char* to, const char* ring, uint64_t at, uint64_t bytes) {
  const uint64_t offset = at % ShmPointToPoint::kRingBytes;
  const uint64_t first = std::min<uint64_t>(bytes, ShmPointToPoint::kRingBytes - offset);
  std::memcpy(to, ring + offset, first);
  if (first < bytes) std::memcpy(to + first, ring, bytes - first);
}

std::string describe(int64_t dtype, int64_t numel) {
  return std::string(c10::toString(static_cast<at::ScalarType>(dtype))) + "[" + std::to_string(numel) + "]";
}

}  // namespace

struct ShmPointToPoint::Op {
  bool is_send = false;
  int peer = 0;
  int64_t tag = 0;
  at::Tensor tensor;
  uint64_t bytes = 0;
  uint64_t moved = 0;         // payload bytes (padded) written or read so far
  bool header_written = false;
  bool finished = false;
  std::exception_ptr error;
  std::chrono::steady_clock::time_point deadline;
};

// A message being read, or read whole and waiting for its recv.
struct ShmPointToPoint::Incoming {
  int64_t tag = 0;
  int64_t dtype = 0;
  int64_t numel = 0;
  uint64_t bytes = 0;
  uint64_t moved = 0;               // payload bytes (padded) read so far
  at::Tensor into;                  // the recv's tensor, or a buffer of this message's own
  std::shared_ptr<Op> recv;         // null until a recv takes it
  bool into_recv = false;           // into is recv->tensor (matched at the header)
  bool skip = false;                // its recv refused it: the bytes are read and dropped
  bool whole = false;
};

struct ShmPointToPoint::Peer {
  char* base = nullptr;  // the pair's mapping
  int created_fd = -1;   // this rank made the pair: its memfd, open while the peer may still need it
  RingCounters* out = nullptr;
  RingCounters* in = nullptr;
  char* out_bytes = nullptr;
  char* in_bytes = nullptr;
  std::deque<std::shared_ptr<Op>> sends;            // in post order; the front is being written
  std::deque<std::shared_ptr<Op>> recvs;            // posted, no message matched yet, post order
  std::deque<std::shared_ptr<Incoming>> unclaimed;  // arrived before their recv, arrival order
  std::shared_ptr<Incoming> reading;                // the message whose bytes come next
  std::string broken;                               // why the pair can carry nothing more
  bool connected() const { return base != nullptr; }
  bool pending() const { return !sends.empty() || !recvs.empty() || (reading && reading->recv); }
};

namespace {
class PointToPointWork : public c10d::Work {
 public:
  PointToPointWork(ShmPointToPoint& engine, std::shared_ptr<ShmPointToPoint::Op> op, c10d::OpType type)
      : c10d::Work(-1, type), engine_(engine), op_(std::move(op)) {}
  bool isCompleted() override { return engine_.done(*op_); }
  bool isSuccess() const override { return engine_.done(*op_) && !op_->error; }
  bool wait(std::chrono::milliseconds) override {  // the group's timeout applies, from the post
    engine_.wait(*op_);
    return true;
  }

 private:
  ShmPointToPoint& engine_;
  std::shared_ptr<ShmPointToPoint::Op> op_;
};
}  // namespace

size_t ShmPointToPoint::region_bytes(int size) {
  const size_t bytes = kRegionHeaderBytes + static_cast<size_t>(size) * sizeof(ShmDoorbell) +
                       static_cast<size_t>(size) * static_cast<size_t>(size) * sizeof(std::atomic<uint64_t>);
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

void ShmPointToPoint::initialise_region(char* region, int size) {
  std::random_device entropy;
  const uint64_t id = (uint64_t{entropy()} << 32 | entropy()) ^ static_cast<uint64_t>(::getpid()) ^
                      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::memcpy(region, &id, sizeof(id));
  region += kRegionHeaderBytes;
  auto* bells = reinterpret_cast<ShmDoorbell*>(region);
  for (int r = 0; r < size; ++r) new (&bells[r]) ShmDoorbell();
  auto* table = reinterpret_cast<std::atomic<uint64_t>*>(region + static_cast<size_t>(size) * sizeof(ShmDoorbell));
  for (int i = 0; i < size * size; ++i) new (&table[i]) std::atomic<uint64_t>(0);
}

ShmPointToPoint::ShmPointToPoint(ShmPeers peers)
    : peers_(std::move(peers)),
      bells_(reinterpret_cast<ShmDoorbell*>(peers_.region + kRegionHeaderBytes)),
      pair_table_(reinterpret_cast<std::atomic<uint64_t>*>(peers_.region + kRegionHeaderBytes +
                                                           static_cast<size_t>(peers_.size) * sizeof(ShmDoorbell))) {
  std::memcpy(&group_id_, peers_.region, sizeof(group_id_));
  for (int r = 0; r < peers_.size; ++r) links_.push_back(std::make_unique<Peer>());
  thread_ = std::thread([this] { run_thread(); });
}

ShmPointToPoint::~ShmPointToPoint() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ring(peers_.rank);
  if (thread_.joinable()) thread_.join();
  // A message this rank sent sits only in a pair it created until the peer maps it: wait for that.
  const auto deadline = std::chrono::steady_clock::now() + std::min<std::chrono::milliseconds>(peers_.timeout, std::chrono::seconds(10));
  for (int peer = 0; peer < peers_.size; ++peer) {
    Peer& link = *links_[peer];
    if (link.created_fd < 0) continue;
    auto* block = reinterpret_cast<PairBlock*>(link.base);
    while (link.out->written.load(std::memory_order_acquire) > 0 && block->opened.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      pollfd exited{peers_.pidfds[peer], POLLIN, 0};
      if (exited.fd >= 0 && ::poll(&exited, 1, 0) > 0) break;
      const timespec slice{0, 10 * 1000 * 1000};
      ring_futex(&block->opened, FUTEX_WAIT, 0, &slice);
    }
  }
  for (int peer = 0; peer < peers_.size; ++peer) {
    Peer& link = *links_[peer];
    if (link.created_fd >= 0 && reinterpret_cast<PairBlock*>(link.base)->opened.load(std::memory_order_acquire) == 0) {
      // The fd number is about to be free for reuse: the entry must not send the peer to it.
      const int low = std::min(peers_.rank, peer), high = std::max(peers_.rank, peer);
      pair_table_[static_cast<size_t>(low) * peers_.size + high].store(kGone, std::memory_order_release);
    }
    if (link.base != nullptr) ::munmap(link.base, pair_bytes());
    if (link.created_fd >= 0) ::close(link.created_fd);
  }
}

void ShmPointToPoint::ring(int peer) {
  ShmDoorbell& bell = bells_[peer];
  bell.rings.fetch_add(1, std::memory_order_seq_cst);
  if (bell.sleepers.load(std::memory_order_seq_cst) > 0) ring_futex(&bell.rings, FUTEX_WAKE, INT_MAX, nullptr);
}

void ShmPointToPoint::sleep_on_bell(uint32_t seen, bool timed) {
  ShmDoorbell& bell = bells_[peers_.rank];
  bell.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (bell.rings.load(std::memory_order_seq_cst) == seen) {
    const timespec slice{0, 100 * 1000 * 1000};
    ring_futex(&bell.rings, FUTEX_WAIT, seen, timed ? &slice : nullptr);
  }
  bell.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

bool ShmPointToPoint::try_connect(int peer) {
  Peer& link = *links_[peer];
  if (link.connected()) return true;
  const int low = std::min(peers_.rank, peer), high = std::max(peers_.rank, peer);
  std::atomic<uint64_t>& entry = pair_table_[static_cast<size_t>(low) * peers_.size + high];
  const std::string pair = "the pair of ranks " + std::to_string(low) + " and " + std::to_string(high);
  uint64_t published = entry.load(std::memory_order_acquire);
  LF_CHECK(published != kGone, RuntimeError, "shm send/recv: rank ", peer, " left the group before ", pair,
           " was opened");
  if (published == 0 && entry.compare_exchange_strong(published, kClaimed, std::memory_order_acq_rel)) {
    const auto unclaim = [&](const std::string& why) {  // the peer must not wait on a claim that failed
      entry.store(0, std::memory_order_release);
      throw RuntimeError("shm send/recv: " + why);
    };
    const int fd = ::memfd_create("lightning-fabric-p2p", MFD_CLOEXEC);
    if (fd < 0) unclaim("memfd_create for " + pair + " failed: " + std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(pair_bytes())) != 0) {
      const int error = errno;
      ::close(fd);
      unclaim("cannot size " + pair + " (" + std::to_string(pair_bytes()) + " bytes): " + std::strerror(error));
    }
    void* memory = ::mmap(nullptr, pair_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (memory == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      unclaim("cannot map " + pair + ": " + std::strerror(error));
    }
    auto* block = new (memory) PairBlock();
    block->magic = kPairMagic;
    block->group = group_id_;
    block->low = low;
    block->high = high;
    link.base = static_cast<char*>(memory);
    link.created_fd = fd;
    entry.store((static_cast<uint64_t>(::getpid()) << 32) | static_cast<uint32_t>(fd), std::memory_order_release);
  } else if (published == 0 || published == kClaimed) {
    return false;  // the peer is making it: microseconds
  } else {
    const int owner = static_cast<int>(published >> 32), owner_fd = static_cast<int>(published & 0xffffffffu);
    const std::string path = "/proc/" + std::to_string(owner) + "/fd/" + std::to_string(owner_fd);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    LF_CHECK(fd >= 0, RuntimeError, "shm send/recv: rank ", peers_.rank, " cannot open rank ", peer, "'s pair ",
             path, ": ", std::strerror(errno), " (has rank ", peer, " exited?)");
    struct stat about {};
    const bool sized = ::fstat(fd, &about) == 0 && static_cast<size_t>(about.st_size) == pair_bytes();
    void* memory = sized ? ::mmap(nullptr, pair_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    ::close(fd);
    const auto* block = static_cast<const PairBlock*>(memory);
    const bool ours = memory != MAP_FAILED && block->magic == kPairMagic && block->group == group_id_ &&
                      block->low == low && block->high == high;
    if (!ours) {
      if (memory != MAP_FAILED) ::munmap(memory, pair_bytes());
      throw RuntimeError("shm send/recv: " + path + " is no longer " + pair + " (rank " + std::to_string(peer) +
                         " left the group)");
    }
    link.base = static_cast<char*>(memory);
    auto* opened = reinterpret_cast<PairBlock*>(link.base);
    opened->opened.store(1, std::memory_order_release);
    ring_futex(&opened->opened, FUTEX_WAKE, INT_MAX, nullptr);
  }
  auto* block = reinterpret_cast<PairBlock*>(link.base);
  const int out_way = peers_.rank == low ? 0 : 1;
  link.out = &block->way[out_way];
  link.in = &block->way[1 - out_way];
  link.out_bytes = link.base + kPairHeaderBytes + static_cast<size_t>(out_way) * kRingBytes;
  link.in_bytes = link.base + kPairHeaderBytes + static_cast<size_t>(1 - out_way) * kRingBytes;
  ring(peer);  // the peer may have ops waiting for the pair
  return true;
}

bool ShmPointToPoint::push(int peer) {
  Peer& link = *links_[peer];
  const uint64_t read = link.out->read.load(std::memory_order_acquire);
  uint64_t written = link.out->written.load(std::memory_order_relaxed);
  const uint64_t start = written;
  while (!link.sends.empty()) {
    Op& op = *link.sends.front();
    if (!op.header_written) {
      if (kRingBytes - (written - read) < kAlign) break;
      const MessageHeader header{kMagic, op.tag, static_cast<int64_t>(op.tensor.scalar_type()), op.tensor.numel(), op.bytes};
      to_ring(link.out_bytes, written, reinterpret_cast<const char*>(&header), sizeof(header));
      written += kAlign;
      op.header_written = true;
    }
    const uint64_t total = padded(op.bytes);
    const uint64_t n = std::min(total - op.moved, kRingBytes - (written - read));
    if (op.moved < op.bytes) {
      const char* data = static_cast<const char*>(op.tensor.data_ptr());
      to_ring(link.out_bytes, written, data + op.moved, std::min(n, op.bytes - op.moved));
    }
    written += n;
    op.moved += n;
    if (op.moved < total) break;
    op.finished = true;
    op.tensor = at::Tensor();
    link.sends.pop_front();
  }
  if (written == start) return false;
  link.out->written.store(written, std::memory_order_release);
  ring(peer);
  return true;
}

void ShmPointToPoint::deliver(Incoming& message) {
  Op& recv = *message.recv;
  if (!message.into_recv) {
    if (message.dtype != static_cast<int64_t>(recv.tensor.scalar_type()) || message.numel != recv.tensor.numel()) {
      recv.error = std::make_exception_ptr(ValueError(
          "shm recv from rank " + std::to_string(recv.peer) + " with tag " + std::to_string(recv.tag) + ": the message is " +
          describe(message.dtype, message.numel) + " but the tensor passed is " +
          describe(static_cast<int64_t>(recv.tensor.scalar_type()), recv.tensor.numel()) +
          ". Sender and receiver must agree on dtype and number of elements."));
    } else if (message.bytes > 0) {
      std::memcpy(recv.tensor.data_ptr(), message.into.data_ptr(), message.bytes);
    }
  }
  recv.moved = padded(message.bytes);
  recv.finished = true;
  recv.tensor = at::Tensor();
}

bool ShmPointToPoint::pull(int peer) {
  Peer& link = *links_[peer];
  const uint64_t written = link.in->written.load(std::memory_order_acquire);
  uint64_t read = link.in->read.load(std::memory_order_relaxed);
  const uint64_t start = read;
  while (read < written) {
    if (!link.reading) {
      if (written - read < kAlign) break;  // never: headers are written whole
      MessageHeader header{};
      from_ring(reinterpret_cast<char*>(&header), link.in_bytes, read, sizeof(header));
      if (header.magic != kMagic) {
        break_pair(peer, "the stream from rank " + std::to_string(peer) + " is corrupt (no message header at byte " +
                             std::to_string(read) + ")");
        return true;
      }
      read += kAlign;
      auto message = std::make_shared<Incoming>();
      message->tag = header.tag;
      message->dtype = header.dtype;
      message->numel = header.numel;
      message->bytes = header.bytes;
      auto match = std::find_if(link.recvs.begin(), link.recvs.end(), [&](const auto& op) { return op->tag == header.tag; });
      if (match != link.recvs.end()) {
        message->recv = *match;
        link.recvs.erase(match);
        const at::Tensor& into = message->recv->tensor;
        if (header.dtype == static_cast<int64_t>(into.scalar_type()) && header.numel == into.numel()) {
          message->into = into;
          message->into_recv = true;
        } else {
          message->skip = true;  // deliver() names the mismatch
        }
      } else {
        message->into = at::empty({header.numel}, at::TensorOptions().dtype(static_cast<at::ScalarType>(header.dtype)));
        link.unclaimed.push_back(message);
      }
      link.reading = message;
    }
    Incoming& message = *link.reading;
    const uint64_t total = padded(message.bytes);
    const uint64_t n = std::min(total - message.moved, written - read);
    if (message.moved < message.bytes && !message.skip) {
      from_ring(static_cast<char*>(message.into.data_ptr()) + message.moved, link.in_bytes, read,
                std::min(n, message.bytes - message.moved));
    }
    read += n;
    message.moved += n;
    if (message.moved < total) break;
    message.whole = true;
    if (message.recv) deliver(message);
    link.reading.reset();
  }
  if (read == start) return false;
  link.in->read.store(read, std::memory_order_release);
  ring(peer);
  return true;
}

void ShmPointToPoint::progress() {
  for (int peer = 0; peer < peers_.size; ++peer) {
    if (peer != peers_.rank) progress_with(peer);
  }
}

void ShmPointToPoint::progress_with(int peer) {
  Peer& link = *links_[peer];
  if (!link.broken.empty()) return;
  try {
    if (!link.connected()) {
      // Made by the peer (its data may be waiting), or needed by an op of ours.
      const int low = std::min(peers_.rank, peer), high = std::max(peers_.rank, peer);
      const uint64_t entry = pair_table_[static_cast<size_t>(low) * peers_.size + high].load(std::memory_order_acquire);
      if ((entry == 0 || entry == kClaimed) && !link.pending()) return;
      if (!try_connect(peer)) return;
    }
    push(peer);
    pull(peer);
  } catch (const std::exception& error) {  // the pair cannot be opened, a buffer not allocated
    break_pair(peer, error.what());
  }
}

bool ShmPointToPoint::pending() const {
  for (const auto& link : links_) {
    if (link->pending()) return true;
  }
  return false;
}

void ShmPointToPoint::break_pair(int peer, const std::string& why) {
  Peer& link = *links_[peer];
  if (link.broken.empty()) link.broken = why;
  auto fail = [&](Op& op) {
    if (op.finished) return;
    op.error = std::make_exception_ptr(RuntimeError(
        std::string("shm ") + (op.is_send ? "send to" : "recv from") + " rank " + std::to_string(peer) + " with tag " +
        std::to_string(op.tag) + " failed after " + std::to_string(std::min(op.moved, op.bytes)) + " of " +
        std::to_string(op.bytes) + " bytes: " + link.broken + "."));
    op.finished = true;
    op.tensor = at::Tensor();
  };
  for (auto& op : link.sends) fail(*op);
  for (auto& op : link.recvs) fail(*op);
  if (link.reading && link.reading->recv) {
    link.reading->recv->moved = link.reading->moved;
    fail(*link.reading->recv);
  }
  link.sends.clear();
  link.recvs.clear();
  link.reading.reset();
}

void ShmPointToPoint::check_peer(int peer) {
  pollfd exited{peers_.pidfds[peer], POLLIN, 0};
  if (exited.fd < 0 || ::poll(&exited, 1, 0) <= 0) return;
  progress_with(peer);  // what it wrote before it died still counts
  if (!links_[peer]->pending()) return;
  break_pair(peer, "rank " + std::to_string(peer) + " (pid " + std::to_string(peers_.pids[peer]) + ") died");
}

c10::intrusive_ptr<c10d::Work> ShmPointToPoint::post(bool is_send, const at::Tensor& tensor, int peer, int tag) {
  const char* call = is_send ? "send" : "recv";
  LF_CHECK(tensor.device().is_cpu() && tensor.is_contiguous(), ValueError, "shm backend ", call,
           ": the tensor must be contiguous and on the CPU, got ", tensor.device(),
           tensor.is_contiguous() ? "" : " (strided)", ".");
  LF_CHECK(peer >= 0 && peer < peers_.size && peer != peers_.rank, ValueError, "shm backend ", call, ": rank ", peer,
           " is not another rank of this group of ", peers_.size, ".");
  auto op = std::make_shared<Op>();
  op->is_send = is_send;
  op->peer = peer;
  op->tag = tag;
  op->tensor = tensor;
  op->bytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
  op->deadline = std::chrono::steady_clock::now() + peers_.timeout;
  bool handed_on = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Peer& link = *links_[peer];
    // A message that arrived whole is received even after the pair broke (a peer that sent and died).
    auto arrived = std::find_if(link.unclaimed.begin(), link.unclaimed.end(),
                                [&](const auto& message) { return message->tag == tag; });
    if (!is_send && arrived != link.unclaimed.end() && ((*arrived)->whole || link.broken.empty())) {
      std::shared_ptr<Incoming> message = *arrived;
      link.unclaimed.erase(arrived);
      message->recv = op;
      if (message->whole) deliver(*message);
    } else if (!link.broken.empty()) {
      op->error = std::make_exception_ptr(RuntimeError(std::string("shm ") + call + (is_send ? " to" : " from") +
                                                       " rank " + std::to_string(peer) + ": " + link.broken + "."));
      op->finished = true;
    } else if (is_send) {
      link.sends.push_back(op);
    } else {
      link.recvs.push_back(op);
    }
    if (!op->finished) progress_with(peer);
    handed_on = !op->finished;
  }
  if (handed_on) ring(peers_.rank);  // the thread takes over what is left
  return c10::make_intrusive<PointToPointWork>(*this, op, is_send ? c10d::OpType::SEND : c10d::OpType::RECV);
}

c10::intrusive_ptr<c10d::Work> ShmPointToPoint::send(const at::Tensor& tensor, int dst, int tag) {
  return post(true, tensor, dst, tag);
}

c10::intrusive_ptr<c10d::Work> ShmPointToPoint::recv(const at::Tensor& tensor, int src, int tag) {
  return post(false, tensor, src, tag);
}

void ShmPointToPoint::connect(const std::vector<int>& peers) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int peer : peers) {
    LF_CHECK(peer >= 0 && peer < peers_.size && peer != peers_.rank, ValueError, "shm backend connect: rank ", peer,
             " is not another rank of this group of ", peers_.size, ".");
    try_connect(peer);
  }
}

bool ShmPointToPoint::done(const Op& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!op.finished) progress_with(op.peer);
  return op.finished;
}

void ShmPointToPoint::wait(Op& op) {
  auto last_check = std::chrono::steady_clock::now();
  for (int spin = 0;; ++spin) {
    const uint32_t seen = bells_[peers_.rank].rings.load(std::memory_order_acquire);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!op.finished) progress_with(op.peer);
      if (!op.finished) {
        const auto now = std::chrono::steady_clock::now();
        if (now - last_check >= std::chrono::milliseconds(100)) {
          last_check = now;
          check_peer(op.peer);
          if (!op.finished && now >= op.deadline) {
            break_pair(op.peer, "timed out after " + std::to_string(peers_.timeout.count()) +
                                    " ms (the collective timeout) waiting for rank " + std::to_string(op.peer));
          }
        }
      }
      if (op.finished) break;
    }
    if (spin < 200) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    sleep_on_bell(seen, true);
  }
  if (op.error) std::rethrow_exception(op.error);
}

void ShmPointToPoint::run_thread() {
  while (true) {
    const uint32_t seen = bells_[peers_.rank].rings.load(std::memory_order_acquire);
    bool waiting = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      progress();
      waiting = pending();
    }
    sleep_on_bell(seen, waiting);  // idle: until rung (a peer's pair or bytes, a post, the destructor)
  }
}

}  // namespace lightning::fabric::internal
