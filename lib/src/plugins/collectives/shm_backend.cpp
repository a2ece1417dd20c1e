#include "lightning/fabric/plugins/collectives/shm_backend.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <sstream>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/internal/store_text.h"
#include "lightning/fabric/plugins/collectives/shm_point_to_point.h"
#include "lightning/fabric/utilities/process.h"

namespace lightning::fabric::internal {
namespace {

constexpr int kMaxRanks = 256;
constexpr size_t kPage = 4096;

// What one rank is about to run: compared across ranks before any byte moves, so a rank in a
// different op, or with another dtype, size, root or reduce op, is an error and never a wrong
// answer. Two slots per rank (by op parity): a rank can be at most one op ahead of its peers.
struct OpCall {
  uint64_t seq = 0;     // ops this rank has run in this group, from 1
  int32_t op = 0;       // c10d::OpType
  int32_t dtype = -1;   // at::ScalarType; -1: none (barrier)
  int64_t numel = 0;    // of the input
  int64_t detail = 0;   // broadcast root, reduce op
};

// The shared control block, at the start of the segment.
struct Control {
  alignas(64) std::atomic<uint32_t> arrived{0};    // ranks in the current barrier
  alignas(64) std::atomic<uint32_t> generation{0}; // barriers completed; the futex word
  std::atomic<uint32_t> sleepers{0};               // ranks asleep on generation
  std::atomic<int32_t> failed_rank{-1};            // a rank that gave up: its peers stop too
  int32_t pids[kMaxRanks] = {};
  OpCall calls[kMaxRanks][2];
};

size_t control_bytes() { return (sizeof(Control) + kPage - 1) / kPage * kPage; }

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE: the word is shared between processes.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

class FinishedWork : public c10d::Work {
 public:
  explicit FinishedWork(c10d::OpType type) : c10d::Work(-1, type) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
};

c10::intrusive_ptr<c10d::Work> finished(c10d::OpType type) { return c10::make_intrusive<FinishedWork>(type); }

void check_tensor(const at::Tensor& tensor, const char* op) {
  LF_CHECK(tensor.device().is_cpu() && tensor.is_contiguous(), ValueError, "shm backend ", op,
           ": tensors must be contiguous and on the CPU, got ", tensor.device(), tensor.is_contiguous() ? "" : " (strided)",
           ". Use gloo or nccl for device tensors.");
}

char* bytes_of(const at::Tensor& tensor) { return static_cast<char*>(tensor.data_ptr()); }

// memcpy for tensors that may be empty: an empty tensor's data pointer may be null.
void copy_bytes(void* to, const void* from, size_t bytes) {
  if (bytes > 0) std::memcpy(to, from, bytes);
}

std::string describe_call(const OpCall& call) {
  std::string text = c10d::opTypeToString(static_cast<c10d::OpType>(call.op));
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  if (call.dtype >= 0) {
    text += std::string(" ") + c10::toString(static_cast<at::ScalarType>(call.dtype)) + "[" +
            std::to_string(call.numel) + " elements]";
  }
  if (call.op == static_cast<int32_t>(c10d::OpType::BROADCAST)) text += " from rank " + std::to_string(call.detail);
  if (call.op == static_cast<int32_t>(c10d::OpType::ALLREDUCE)) {
    switch (static_cast<c10d::ReduceOp::RedOpType>(call.detail)) {
      case c10d::ReduceOp::SUM: text += " (sum)"; break;
      case c10d::ReduceOp::AVG: text += " (avg)"; break;
      case c10d::ReduceOp::PRODUCT: text += " (product)"; break;
      case c10d::ReduceOp::MIN: text += " (min)"; break;
      case c10d::ReduceOp::MAX: text += " (max)"; break;
      default: break;
    }
  }
  return text;
}

bool same_call(const OpCall& a, const OpCall& b) {
  return a.seq == b.seq && a.op == b.op && a.dtype == b.dtype && a.numel == b.numel && a.detail == b.detail;
}

}  // namespace

struct ShmBackend::Segment {
  int rank = 0;
  int size = 1;
  char* base = nullptr;
  size_t bytes = 0;
  Control* control = nullptr;
  std::vector<int> peer_pidfds;  // -1 for this rank
  ~Segment() {
    for (int fd : peer_pidfds) {
      if (fd >= 0) ::close(fd);
    }
    if (base != nullptr) ::munmap(base, bytes);
  }
};

ShmBackend::ShmBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), segment_(std::make_unique<Segment>()), timeout_(timeout) {
  LF_CHECK(size <= kMaxRanks, ValueError, "shm backend: ", size, " ranks; at most ", kMaxRanks, " on one node.");
  Segment& segment = *segment_;
  segment.rank = rank;
  segment.size = size;
  segment.bytes = control_bytes() + ShmPointToPoint::region_bytes(size) + static_cast<size_t>(size + 1) * kChunkBytes +
                  static_cast<size_t>(2 * size) * kSmallBytes;
  int fd = -1;
  if (rank == 0) {
    fd = ::memfd_create("lightning-fabric-shm", MFD_CLOEXEC);
    LF_CHECK(fd >= 0, RuntimeError, "shm backend: memfd_create failed: ", std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(segment.bytes)) != 0) {
      const int error = errno;
      ::close(fd);
      throw RuntimeError(std::string("shm backend: cannot size the segment (") + std::to_string(segment.bytes) +
                         " bytes): " + std::strerror(error));
    }
  } else {
    const std::vector<uint8_t> published = store->get("shm/segment");
    std::istringstream fields(store_text(published));
    int owner = 0, owner_fd = 0;
    std::string owner_host;
    fields >> owner >> owner_fd >> owner_host;
    LF_CHECK(owner_host == host_name(), RuntimeError, "shm backend: rank ", rank, " runs on ", host_name(),
             " but rank 0 on ", owner_host, ": every rank of an shm group must be on one machine. Use gloo across "
             "nodes (the default there).");
    const std::string path = "/proc/" + std::to_string(owner) + "/fd/" + std::to_string(owner_fd);
    fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    LF_CHECK(fd >= 0, RuntimeError, "shm backend: rank ", rank, " cannot open rank 0's segment ", path, ": ",
             std::strerror(errno), ". The ranks must run as the same user on one machine, in one pid namespace.");
  }
  void* memory = ::mmap(nullptr, segment.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_error = errno;
  if (rank != 0 || memory == MAP_FAILED) ::close(fd);
  LF_CHECK(memory != MAP_FAILED, RuntimeError, "shm backend: cannot map ", segment.bytes, " bytes: ",
           std::strerror(map_error));
  segment.base = static_cast<char*>(memory);
  segment.control = reinterpret_cast<Control*>(segment.base);
  if (rank == 0) {
    // Initialised before it is published: a peer may map it and arrive at the barrier at once.
    new (segment.control) Control();
    ShmPointToPoint::initialise_region(segment.base + control_bytes(), size);
    store->set("shm/segment", std::to_string(::getpid()) + " " + std::to_string(fd) + " " + host_name());
  }
  segment.control->pids[rank] = static_cast<int32_t>(::getpid());
  // Rank 0's control block is initialised before it publishes; every rank maps before this
  // barrier returns, so rank 0 may close its descriptor: the mappings keep the memory alive, and it
  // goes with the last rank. Nothing is ever named in /dev/shm.
  segment.peer_pidfds.assign(size, -1);
  wait_all();
  if (rank == 0) ::close(fd);
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) segment.peer_pidfds[peer] = static_cast<int>(::syscall(SYS_pidfd_open, segment.control->pids[peer], 0));
  }
  point_to_point_ = std::make_unique<ShmPointToPoint>(ShmPeers{rank, size, timeout, segment.base + control_bytes(),
                                                               segment.control->pids, segment.peer_pidfds});
}

// The background thread: a queue of ops run in order; started at the first in_background call.
class ShmBackend::Background {
 public:
  class Task : public c10d::Work {
   public:
    Task(c10d::OpType type, std::function<void()> op) : c10d::Work(-1, type), op_(std::move(op)) {}
    void run() {
      std::exception_ptr error;
      try {
        op_();
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = error;
      done_ = true;
      finished_.notify_all();
    }
    bool isCompleted() override {
      std::lock_guard<std::mutex> lock(mutex_);
      return done_;
    }
    bool isSuccess() const override {
      std::lock_guard<std::mutex> lock(mutex_);
      return done_ && !error_;
    }
    bool wait(std::chrono::milliseconds) override {  // the op's own barriers enforce the timeout
      std::unique_lock<std::mutex> lock(mutex_);
      finished_.wait(lock, [this] { return done_; });
      if (error_) std::rethrow_exception(error_);
      return true;
    }

   private:
    std::function<void()> op_;
    mutable std::mutex mutex_;
    std::condition_variable finished_;
    bool done_ = false;
    std::exception_ptr error_;
  };

  ~Background() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, std::function<void()> op) {
    auto task = c10::make_intrusive<Task>(type, std::move(op));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
      queue_.push_back(task);
    }
    changed_.notify_all();
    return task;
  }
  void drain() {
    if (std::this_thread::get_id() == thread_.get_id()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      auto task = queue_.front();
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      task->run();
      lock.lock();
      busy_ = false;
      changed_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<c10::intrusive_ptr<Task>> queue_;
  bool busy_ = false, stopping_ = false;
  std::thread thread_;
};

ShmBackend::~ShmBackend() = default;

c10::intrusive_ptr<c10d::Work> ShmBackend::in_background(c10d::OpType type, std::function<void()> op) {
  if (!background_) background_ = std::make_unique<Background>();
  return background_->submit(type, std::move(op));
}

void ShmBackend::drain() {
  if (background_) background_->drain();
}

char* ShmBackend::area(int rank) const {
  return segment_->base + control_bytes() + ShmPointToPoint::region_bytes(segment_->size) +
         static_cast<size_t>(rank) * kChunkBytes;
}

char* ShmBackend::result_area() const { return area(segment_->size); }

char* ShmBackend::small_area(int rank) const {
  const size_t slot = static_cast<size_t>(2 * rank) + static_cast<size_t>(calls_ & 1);
  return area(segment_->size + 1) + slot * kSmallBytes;
}

at::Tensor ShmBackend::area_tensor(char* base, int64_t count, const at::Tensor& like) const {
  return at::from_blob(base, {count}, like.options());
}

// The barrier, then (first barrier of an op) the comparison of every rank's OpCall.
// wait_for_peers: spin briefly (a peer is usually microseconds away), then sleep on the generation word, waking
// every 100 ms to check the timeout, the peers' liveness and whether a peer gave up.
void ShmBackend::wait_all() {
  wait_for_peers();
  if (!check_pending_) return;
  check_pending_ = false;
  const Control& control = *segment_->control;
  const int slot = static_cast<int>(calls_ & 1);
  const OpCall& mine = control.calls[segment_->rank][slot];
  bool same = true;
  for (int peer = 0; peer < segment_->size; ++peer) same = same && same_call(control.calls[peer][slot], mine);
  if (same) return;
  std::string ranks;
  for (int peer = 0; peer < segment_->size; ++peer) {
    const OpCall& call = control.calls[peer][slot];
    ranks += (peer == 0 ? "" : "; ") + std::string("rank ") + std::to_string(peer) + ": #" + std::to_string(call.seq) +
             " " + describe_call(call);
  }
  throw ValueError("Collective mismatch in the shm group (" + ranks +
                   "). Every rank must issue the same collectives in the same order, with the same dtype and size; "
                   "found before any data moved.");
}

void ShmBackend::begin(c10d::OpType op, const at::Tensor* input, int64_t detail) {
  ++calls_;
  OpCall& call = segment_->control->calls[segment_->rank][calls_ & 1];
  call.seq = calls_;
  call.op = static_cast<int32_t>(op);
  call.dtype = input != nullptr ? static_cast<int32_t>(input->scalar_type()) : -1;
  call.numel = input != nullptr ? input->numel() : 0;
  call.detail = detail;
  check_pending_ = true;  // the next wait_all compares every rank's call
}

void ShmBackend::wait_for_peers() {
  Segment& segment = *segment_;
  Control& control = *segment.control;
  const uint32_t generation = control.generation.load(std::memory_order_acquire);
  if (control.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(segment.size)) {
    control.arrived.store(0, std::memory_order_relaxed);
    control.generation.fetch_add(1, std::memory_order_seq_cst);  // publishes every rank's copies
    if (control.sleepers.load(std::memory_order_seq_cst) > 0) futex(&control.generation, FUTEX_WAKE, INT_MAX, nullptr);
    return;
  }
  for (int spin = 0; spin < 2000; ++spin) {
    if (control.generation.load(std::memory_order_acquire) != generation) return;
    if (spin >= 1000) {
      sched_yield();  // oversubscribed: let the peer we wait for run
    } else {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    control.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (control.generation.load(std::memory_order_seq_cst) == generation) {
      const timespec slice{0, 100 * 1000 * 1000};
      futex(&control.generation, FUTEX_WAIT, generation, &slice);
    }
    control.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (control.generation.load(std::memory_order_acquire) != generation) return;
    const int32_t failed = control.failed_rank.load(std::memory_order_acquire);
    if (failed >= 0) {
      throw RuntimeError("shm collective on rank " + std::to_string(segment.rank) + ": rank " + std::to_string(failed) +
                         " gave up (see its error); stopping too.");
    }
    for (int peer = 0; peer < segment.size; ++peer) {
      pollfd exited{segment.peer_pidfds[peer], POLLIN, 0};
      if (exited.fd >= 0 && ::poll(&exited, 1, 0) > 0) {
        control.failed_rank.store(segment.rank, std::memory_order_release);
        futex(&control.generation, FUTEX_WAKE, INT_MAX, nullptr);
        throw RuntimeError("shm collective on rank " + std::to_string(segment.rank) + ": rank " + std::to_string(peer) +
                           " (pid " + std::to_string(control.pids[peer]) + ") died while the others waited for it.");
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      control.failed_rank.store(segment.rank, std::memory_order_release);
      futex(&control.generation, FUTEX_WAKE, INT_MAX, nullptr);
      throw RuntimeError("shm collective on rank " + std::to_string(segment.rank) + " timed out after " +
                         std::to_string(timeout_.count()) + " ms waiting for the other ranks (the collective timeout).");
    }
  }
}

// Rank r's share [lo, hi) of a chunk of `count` elements: the result area gets rank 0's values,
// then rank 1's are combined in, and so on (the same order everywhere).
namespace {
// out = op(out, in) elementwise, for the ops the shm backend supports (AVG adds; the caller divides).
void combine(at::Tensor& out, const at::Tensor& in, c10d::ReduceOp op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG:
      out.add_(in);
      break;
    case c10d::ReduceOp::PRODUCT:
      out.mul_(in);
      break;
    case c10d::ReduceOp::MAX:
      at::maximum_out(out, out, in);
      break;
    case c10d::ReduceOp::MIN:
      at::minimum_out(out, out, in);
      break;
    default:
      break;  // refused before any barrier
  }
}

bool supported(c10d::ReduceOp::RedOpType op) {
  return op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG || op == c10d::ReduceOp::MAX ||
         op == c10d::ReduceOp::MIN || op == c10d::ReduceOp::PRODUCT;
}
}  // namespace

void ShmBackend::reduce_share(const at::Tensor& like, int64_t count, c10d::ReduceOp op) {
  const int size = segment_->size, rank = segment_->rank;
  const int64_t lo = count * rank / size, hi = count * (rank + 1) / size;
  if (hi == lo) return;
  at::Tensor out = area_tensor(result_area(), count, like).slice(0, lo, hi);
  out.copy_(area_tensor(area(0), count, like).slice(0, lo, hi));
  for (int peer = 1; peer < size; ++peer) combine(out, area_tensor(area(peer), count, like).slice(0, lo, hi), op);
  if (op == c10d::ReduceOp::AVG) out.div_(size);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  drain();
  LF_CHECK(tensors.size() == 1, ValueError, "shm backend allreduce: one tensor per call, got ", tensors.size(), ".");
  at::Tensor& tensor = tensors[0];
  check_tensor(tensor, "allreduce");
  const c10d::ReduceOp::RedOpType op = opts.reduceOp;
  LF_CHECK(supported(op), ValueError, "shm backend allreduce: this reduce op is not supported; use sum, avg, max, min or product.");
  LF_CHECK(op != c10d::ReduceOp::AVG || at::isFloatingType(tensor.scalar_type()), ValueError,
           "shm backend allreduce: avg of ", tensor.scalar_type(), " tensors is not defined; use sum and divide.");
  begin(c10d::OpType::ALLREDUCE, &tensor, static_cast<int64_t>(op));
  const int64_t element = tensor.element_size();
  const int64_t chunk = static_cast<int64_t>(kChunkBytes) / element;
  char* data = bytes_of(tensor);
  for (int64_t offset = 0; offset == 0 || offset < tensor.numel(); offset += chunk) {
    const int64_t count = std::min(chunk, tensor.numel() - offset);
    copy_bytes(area(segment_->rank), data + offset * element, static_cast<size_t>(count * element));
    wait_all();
    reduce_share(tensor, count, opts.reduceOp);
    wait_all();
    copy_bytes(data + offset * element, result_area(), static_cast<size_t>(count * element));
  }
  return finished(c10d::OpType::ALLREDUCE);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  drain();
  LF_CHECK(tensors.size() == 1, ValueError, "shm backend broadcast: one tensor per call, got ", tensors.size(), ".");
  at::Tensor& tensor = tensors[0];
  check_tensor(tensor, "broadcast");
  LF_CHECK(opts.rootRank >= 0 && opts.rootRank < segment_->size, ValueError, "shm backend broadcast: src=",
           opts.rootRank, " is not a rank of this group of ", segment_->size, ".");
  begin(c10d::OpType::BROADCAST, &tensor, opts.rootRank);
  const int64_t bytes = tensor.numel() * tensor.element_size();
  char* data = bytes_of(tensor);
  if (bytes <= static_cast<int64_t>(kSmallBytes)) {
    // One barrier: the root's slot alternates by op parity, and no rank can start the op after
    // next (the slot's next use) before every rank has arrived at the next op, copies done.
    if (segment_->rank == opts.rootRank) copy_bytes(small_area(opts.rootRank), data, static_cast<size_t>(bytes));
    wait_all();
    if (segment_->rank != opts.rootRank) copy_bytes(data, small_area(opts.rootRank), static_cast<size_t>(bytes));
    return finished(c10d::OpType::BROADCAST);
  }
  const auto chunk = static_cast<int64_t>(kChunkBytes);
  for (int64_t offset = 0; offset == 0 || offset < bytes; offset += chunk) {
    const int64_t count = std::min(chunk, bytes - offset);
    if (segment_->rank == opts.rootRank) copy_bytes(area(opts.rootRank), data + offset, static_cast<size_t>(count));
    wait_all();
    if (segment_->rank != opts.rootRank) copy_bytes(data + offset, area(opts.rootRank), static_cast<size_t>(count));
    wait_all();
  }
  return finished(c10d::OpType::BROADCAST);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions&) {
  drain();
  check_tensor(input, "allgather");
  check_tensor(output, "allgather");
  const int size = segment_->size;
  const int64_t bytes = input.numel() * input.element_size();
  LF_CHECK(output.numel() * output.element_size() == bytes * size, ValueError,
           "shm backend allgather: the output must hold world_size x the input's elements.");
  begin(c10d::OpType::_ALLGATHER_BASE, &input, 0);
  const char* in = bytes_of(input);
  char* out = bytes_of(output);
  const auto chunk = static_cast<int64_t>(kChunkBytes);
  for (int64_t offset = 0; offset == 0 || offset < bytes; offset += chunk) {
    const int64_t count = std::min(chunk, bytes - offset);
    copy_bytes(area(segment_->rank), in + offset, static_cast<size_t>(count));
    wait_all();
    for (int peer = 0; peer < size; ++peer) copy_bytes(out + peer * bytes + offset, area(peer), static_cast<size_t>(count));
    wait_all();
  }
  return finished(c10d::OpType::_ALLGATHER_BASE);
}

// `in` holds world_size pieces of n elements; piece p's [offset, offset + count) goes to slot p of
// this rank's area (slots of count elements).
void ShmBackend::stage_pieces(const char* in, int64_t n, int64_t offset, int64_t count, int64_t element) {
  for (int piece = 0; piece < segment_->size; ++piece) {
    copy_bytes(area(segment_->rank) + piece * count * element, in + (piece * n + offset) * element,
                static_cast<size_t>(count * element));
  }
}

c10::intrusive_ptr<c10d::Work> ShmBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  drain();
  check_tensor(input, "reduce_scatter");
  check_tensor(output, "reduce_scatter");
  const int size = segment_->size, rank = segment_->rank;
  const int64_t n = output.numel();
  LF_CHECK(input.numel() == n * size, ValueError,
           "shm backend reduce_scatter: the input must hold world_size x the output's elements.");
  const c10d::ReduceOp::RedOpType op = opts.reduceOp;
  LF_CHECK(supported(op), ValueError, "shm backend reduce_scatter: this reduce op is not supported; use sum, avg, max, "
           "min or product.");
  LF_CHECK(op != c10d::ReduceOp::AVG || at::isFloatingType(input.scalar_type()), ValueError,
           "shm backend reduce_scatter: avg of ", input.scalar_type(), " tensors is not defined; use sum and divide.");
  begin(c10d::OpType::_REDUCE_SCATTER_BASE, &input, static_cast<int64_t>(op));
  const int64_t element = input.element_size();
  const int64_t chunk = static_cast<int64_t>(kChunkBytes) / element / size;  // each area holds size pieces
  const char* in = bytes_of(input);
  at::Tensor flat_out = output.view(-1);
  for (int64_t offset = 0; offset == 0 || offset < n; offset += chunk) {
    const int64_t count = std::min(chunk, n - offset);
    stage_pieces(in, n, offset, count, element);
    wait_all();
    at::Tensor out = flat_out.slice(0, offset, offset + count);
    out.copy_(area_tensor(area(0) + rank * count * element, count, input));
    for (int peer = 1; peer < size; ++peer) combine(out, area_tensor(area(peer) + rank * count * element, count, input), op);
    if (op == c10d::ReduceOp::AVG) out.div_(size);
    wait_all();
  }
  return finished(c10d::OpType::_REDUCE_SCATTER_BASE);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& output_splits,
                                                         std::vector<int64_t>& input_splits,
                                                         const c10d::AllToAllOptions&) {
  drain();
  check_tensor(input, "alltoall");
  check_tensor(output, "alltoall");
  LF_CHECK(output_splits.empty() && input_splits.empty(), ValueError,
           "shm backend alltoall: only equal splits are supported (leave the split sizes empty).");
  const int size = segment_->size, rank = segment_->rank;
  LF_CHECK(input.numel() == output.numel() && input.numel() % size == 0, ValueError,
           "shm backend alltoall: input and output must have the same number of elements, a multiple of world_size.");
  begin(c10d::OpType::ALLTOALL_BASE, &input, 0);
  const int64_t element = input.element_size();
  const int64_t n = input.numel() / size;  // elements each rank sends to each rank
  const int64_t chunk = static_cast<int64_t>(kChunkBytes) / element / size;
  const char* in = bytes_of(input);
  char* out = bytes_of(output);
  for (int64_t offset = 0; offset == 0 || offset < n; offset += chunk) {
    const int64_t count = std::min(chunk, n - offset);
    stage_pieces(in, n, offset, count, element);
    wait_all();
    for (int peer = 0; peer < size; ++peer) {
      copy_bytes(out + (peer * n + offset) * element, area(peer) + rank * count * element,
                  static_cast<size_t>(count * element));
    }
    wait_all();
  }
  return finished(c10d::OpType::ALLTOALL_BASE);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  LF_CHECK(tensors.size() == 1, ValueError, "shm backend send: one tensor per call, got ", tensors.size(), ".");
  return point_to_point_->send(tensors[0], dst, tag);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  LF_CHECK(tensors.size() == 1, ValueError, "shm backend recv: one tensor per call, got ", tensors.size(), ".");
  return point_to_point_->recv(tensors[0], src, tag);
}

void ShmBackend::connect(const std::vector<int>& peers) { point_to_point_->connect(peers); }

c10::intrusive_ptr<c10d::Work> ShmBackend::barrier(const c10d::BarrierOptions&) {
  drain();
  begin(c10d::OpType::BARRIER, nullptr, 0);
  wait_all();
  return finished(c10d::OpType::BARRIER);
}

}  // namespace lightning::fabric::internal
