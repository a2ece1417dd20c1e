// The "shm+gloo" process-group backend: CPU jobs on several machines with the same number of
// ranks L on each (docs/distributed.md, "shm+gloo across machines").
//
// It holds three groups: gloo over every rank (the world), shm over the ranks of this machine, and
// gloo over the ranks at this rank's position on every machine (its column; L columns). A sum or
// mean all-reduce of a floating or integer tensor runs in three steps: reduce-scatter through shm
// (rank i of a machine gets the machine's sum of piece i of L), all-reduce of that piece over
// column i with gloo, all-gather of the pieces through shm. Each machine thus sends 1/L of the
// tensor per rank across the network, and nothing of it between its own ranks. Every rank gets
// bitwise the same result: each piece is summed in one order by its column, then copied.
//
// Every other collective (max, min, product, broadcast, all-gather, reduce-scatter, all-to-all,
// reduce, gather, scatter) and point-to-point send and recv run on the world gloo group. All-reduces run on the shm group's background thread, one at a
// time in the order they were issued, so they overlap the caller's work as gloo's do; barrier()
// first waits for them. Not thread-safe: ops are issued from one thread, as with every collective.
#pragma once

#include <chrono>
#include <memory>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace lightning::fabric::internal {

class ShmBackend;

class ShmGlooBackend : public c10d::Backend {
 public:
  /// world: gloo over every rank; host: shm over this machine's ranks (L of them); column: gloo
  /// over the ranks at this rank's position on every machine. All three are collective to build
  /// (make_group_backend does it); ownership is shared with the caller.
  ShmGlooBackend(int rank, int size, c10::intrusive_ptr<c10d::Backend> world, c10::intrusive_ptr<ShmBackend> host,
                 c10::intrusive_ptr<c10d::Backend> column);
  /// Runs the all-reduces still queued, then releases the groups.
  ~ShmGlooBackend() override;

  const std::string getBackendName() const override { return "shm+gloo"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  c10::intrusive_ptr<c10d::Backend> world_;
  c10::intrusive_ptr<ShmBackend> host_;
  c10::intrusive_ptr<c10d::Backend> column_;
};

}  // namespace lightning::fabric::internal
