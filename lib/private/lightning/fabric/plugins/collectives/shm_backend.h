// The "shm" process-group backend: collectives between the ranks of one node through one shared
// memory segment instead of sockets (docs/distributed.md, "The shm backend").
//
// The segment is a memfd of local rank 0 of the group: it has no name in /dev/shm, the other ranks
// open it through /proc/<pid>/fd/<fd>, and it is gone when the last rank exits, however the job
// ends. It holds a control block (a barrier, an abort flag, the ranks' pids), point-to-point's
// doorbells and pair table (shm_point_to_point.h), W + 1 staging areas of kChunkBytes each (one
// per rank, one for results) and two small slots per rank (kSmallBytes, by op parity). Every op
// moves its tensors in chunks: each rank copies its chunk into its own area, a barrier, each rank
// reduces (or copies) its 1/W share of the chunk, a barrier, each rank copies the result out. A
// broadcast that fits a small slot takes one barrier: the root's slot of this op's parity is not
// written again before every rank has reached the next op. Reductions always add
// rank 0's value first, then rank 1's, ..., so every rank gets bitwise the same result.
//
// Waiting: a brief spin, then a futex sleep on the barrier's generation word, waking every 100 ms
// to check the collective timeout, the abort flag and the peers' pidfds: a dead peer is named at
// once. Memory ordering: arrivals are acq_rel fetch_adds, the generation is published with release
// and read with acquire, so each rank's copies into its area happen-before the others read them.
//
// Before any data moves, every rank publishes what it is about to run (op, dtype, size, root or
// reduce op) and compares after the first barrier: a mismatch is a ValueError on every rank, never
// a wrong answer or a hang. Ops run to completion in the call: the returned Work is already
// finished, except for those started through in_background (a prefetch), which run on the
// group's one background thread, and send/recv, which run beside the collectives. CPU tensors only, contiguous (Collective stages others), every
// dtype ATen can add and compare. Not thread-safe: ops are issued from one thread per group, as
// with every collective.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace lightning::fabric::internal {

class ShmPointToPoint;

class ShmBackend : public c10d::Backend {
 public:
  static constexpr size_t kChunkBytes = size_t{4} << 20;
  /// A broadcast of at most this many bytes takes one barrier, through a slot per rank and op parity.
  static constexpr size_t kSmallBytes = size_t{64} << 10;

  /// Collective over the group's ranks: local rank 0 creates the segment and publishes it in
  /// store; the others map it. Throws RuntimeError when a rank cannot map it (another node: shm
  /// needs every rank on one machine).
  ShmBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout);
  ~ShmBackend() override;

  const std::string getBackendName() const override { return "shm"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  /// Point-to-point through pair rings of their own (shm_point_to_point.h): asynchronous, not
  /// ordered with the collectives, one contiguous CPU tensor per call; tags match in any order.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  /// Makes the pairs with these peers now rather than at their first send or recv.
  void connect(const std::vector<int>& peers);
  /// Runs op (one of the calls above) on the group's background thread, after every op issued
  /// before it; the returned Work completes when it has run (wait() rethrows its error). An op
  /// called directly first waits for the background ones, so ops run one at a time, in the order
  /// they were issued, on every rank alike.
  c10::intrusive_ptr<c10d::Work> in_background(c10d::OpType type, std::function<void()> op);

 private:
  class Background;
  void drain();  // waits until no background op is queued or running (no-op on the background thread)
  struct Segment;
  void begin(c10d::OpType op, const at::Tensor* input, int64_t detail);  // publishes this rank's OpCall
  void wait_all();        // the barrier; after begin() it also compares every rank's OpCall
  void wait_for_peers();  // the barrier alone
  char* area(int rank) const;
  char* result_area() const;
  char* small_area(int rank) const;  // rank's slot for the current op's parity
  at::Tensor area_tensor(char* base, int64_t count, const at::Tensor& like) const;
  void stage_pieces(const char* in, int64_t n, int64_t offset, int64_t count, int64_t element);
  void reduce_share(const at::Tensor& like, int64_t count, c10d::ReduceOp op);
  std::unique_ptr<Segment> segment_;
  std::unique_ptr<ShmPointToPoint> point_to_point_;  // after the segment: stopped before it goes
  std::chrono::milliseconds timeout_;
  uint64_t calls_ = 0;          // ops begun in this group
  bool check_pending_ = false;  // begin() ran; the next wait_all compares
  std::unique_ptr<Background> background_;  // last: stopped before the segment goes
};

}  // namespace lightning::fabric::internal
