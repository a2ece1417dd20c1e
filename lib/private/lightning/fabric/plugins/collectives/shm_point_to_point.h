// Point-to-point send and recv between the ranks of one shm group (docs/distributed.md, "The shm
// backend"), as ShmBackend's send and recv.
//
// Channels. Each pair of ranks that exchanges a message gets a memfd of its own: whichever of the
// two touches the pair first claims it with a compare-and-swap in the group's pair table, creates
// it and publishes "pid, fd" there; the other opens it through /proc/<pid>/fd, and checks that
// the file is that pair of this group before writing to it (a creator that leaves the group
// marks its unopened pairs gone, since its fd number may be reused). Like the group's
// segment it never has a name in /dev/shm and goes with the last process that maps it. It holds
// one ring of kRingBytes per direction, each with a written and a read byte counter (only the
// sender moves written, only the receiver moves read).
//
// Messages. A 64-byte header (tag, dtype, elements) and the tensor's bytes, padded to 64. The
// sender writes as much as the ring has room for; the receiver copies bytes out into the tensor
// of the first posted recv with that tag, or, when none is posted yet, into a buffer of its own
// that a later recv of the tag takes. Messages of one tag are matched in the order sent; tags
// may be received in any order. A recv whose tensor is not the message's dtype and element count
// fails with a ValueError naming both (the message's bytes are skipped, the stream goes on).
//
// Progress. A send is done once its last byte is in the ring (its tensor may then be reused); a
// recv once its last byte is out. The posting call moves what it can at once (a send that fits
// the ring is finished when send() returns), wait() moves bytes until its op is done, and one
// thread per group moves the rest in the background, so a send finishes while its caller
// computes or waits elsewhere. Every mover rings the peer's doorbell (a futex word in the group's
// segment) after it writes or frees ring bytes, and after it makes a pair. Waiters sleep on their
// own doorbell, waking within 100 ms to check the peer's pidfd and the timeout; the idle thread
// sleeps until rung.
//
// Failures. A peer that dies fails the ops waiting on it with a RuntimeError naming it and how
// many of the message's bytes had moved; an op not done within the group's timeout fails the
// same way. Either breaks the pair: its later ops fail at once (the stream's position is lost).
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace lightning::fabric::internal {

/// One per rank in the group's segment: ringing adds one and wakes the rank's sleepers.
struct ShmDoorbell {
  alignas(64) std::atomic<uint32_t> rings{0};
  std::atomic<uint32_t> sleepers{0};
};

/// What the group's segment gives the engine: its shared region (the group's id, doorbells, then
/// the pair table)
/// and the peers' pids and pidfds (-1 for this rank).
struct ShmPeers {
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  char* region = nullptr;  // ShmPointToPoint::region_bytes(size), initialised by initialise_region
  const int32_t* pids = nullptr;
  std::vector<int> pidfds;
};

class ShmPointToPoint {
 public:
  static constexpr size_t kRingBytes = size_t{4} << 20;  // per direction of a pair

  /// Bytes of the shared region for a group of `size` ranks (a page multiple).
  static size_t region_bytes(int size);
  /// Rank 0, before publishing the segment: a random id for the group, doorbells at zero, every
  /// pair unclaimed.
  static void initialise_region(char* region, int size);

  /// Starts the thread, which opens every pair a peer makes with this rank as soon as it is made.
  explicit ShmPointToPoint(ShmPeers peers);
  /// Stops the thread. Waits (at most 10 s or the timeout, less if the peer dies) until each peer
  /// has opened every pair this rank created and sent into, so a message sent just before exit
  /// still arrives.
  ~ShmPointToPoint();

  /// tensor: contiguous, CPU; kept alive by the returned Work until done.
  c10::intrusive_ptr<c10d::Work> send(const at::Tensor& tensor, int dst, int tag);
  c10::intrusive_ptr<c10d::Work> recv(const at::Tensor& tensor, int src, int tag);
  /// Creates or opens the pairs with these peers now (no waiting on them).
  void connect(const std::vector<int>& peers);

  struct Op;
  struct Peer;
  struct Incoming;
  /// Waits until op is done (moving bytes meanwhile); rethrows its error.
  void wait(Op& op);
  bool done(const Op& op);

 private:
  void run_thread();
  bool pending() const;              // under mutex_: an op of this rank is not done
  void progress();                   // under mutex_: moves every pair's bytes (the thread)
  void progress_with(int peer);      // under mutex_: that pair's (a post, a wait: the thread does the rest)
  bool try_connect(int peer);        // under mutex_
  bool push(int peer);               // under mutex_
  bool pull(int peer);               // under mutex_
  void deliver(Incoming& message);   // under mutex_: into its recv, which is then done
  void check_peer(int peer);         // under mutex_: fails the peer's ops if it died
  void break_pair(int peer, const std::string& why);  // under mutex_
  void ring(int peer);
  void sleep_on_bell(uint32_t seen, bool timed);  // timed: wake within 100 ms regardless
  c10::intrusive_ptr<c10d::Work> post(bool is_send, const at::Tensor& tensor, int peer, int tag);

  ShmPeers peers_;
  uint64_t group_id_ = 0;  // random, from the region: pairs of other groups are never taken for ours
  ShmDoorbell* bells_;
  std::atomic<uint64_t>* pair_table_;
  std::vector<std::unique_ptr<Peer>> links_;  // by rank
  std::mutex mutex_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace lightning::fabric::internal
