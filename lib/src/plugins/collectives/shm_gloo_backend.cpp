#include "lightning/fabric/plugins/collectives/shm_gloo_backend.h"

#include <ATen/ATen.h>

#include "lightning/fabric/plugins/collectives/shm_backend.h"

namespace lightning::fabric::internal {

ShmGlooBackend::ShmGlooBackend(int rank, int size, c10::intrusive_ptr<c10d::Backend> world,
                               c10::intrusive_ptr<ShmBackend> host, c10::intrusive_ptr<c10d::Backend> column)
    : c10d::Backend(rank, size), world_(std::move(world)), host_(std::move(host)), column_(std::move(column)) {}

// The shm group goes first: its background thread finishes the queued all-reduces, which use the
// column group, before the column group goes.
ShmGlooBackend::~ShmGlooBackend() { host_.reset(); }

namespace {
// The three steps, in place on a contiguous CPU tensor; on host's background thread.
void sum_across_hosts(ShmBackend& host, c10d::Backend& column, at::Tensor& tensor) {
  const int64_t local = host.getSize(), numel = tensor.numel();
  const int64_t piece = (numel + local - 1) / local;
  const bool padded = piece * local != numel;  // to L equal pieces; the zeros add nothing
  at::Tensor whole = padded ? at::cat({tensor.view(-1), at::zeros({piece * local - numel}, tensor.options())})
                            : tensor.view(-1);
  at::Tensor mine = at::empty({piece}, tensor.options());
  host._reduce_scatter_base(mine, whole, c10d::ReduceScatterOptions());
  std::vector<at::Tensor> one{mine};
  column.allreduce(one, c10d::AllreduceOptions())->wait();
  host._allgather_base(whole, mine, c10d::AllgatherOptions());
  if (padded) tensor.view(-1).copy_(whole.narrow(0, 0, numel));
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ShmGlooBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  const c10d::ReduceOp::RedOpType op = opts.reduceOp;
  const bool summed = op == c10d::ReduceOp::SUM || (op == c10d::ReduceOp::AVG && at::isFloatingType(tensors[0].scalar_type()));
  if (tensors.size() != 1 || !summed || !tensors[0].is_contiguous() || !tensors[0].device().is_cpu() ||
      tensors[0].numel() == 0) {
    return world_->allreduce(tensors, opts);
  }
  at::Tensor tensor = tensors[0];
  const int world = getSize();
  ShmBackend* host = host_.get();
  c10d::Backend* column = column_.get();
  return host->in_background(c10d::OpType::ALLREDUCE, [host, column, tensor, op, world]() mutable {
    sum_across_hosts(*host, *column, tensor);
    if (op == c10d::ReduceOp::AVG) tensor.div_(world);
  });
}

c10::intrusive_ptr<c10d::Work> ShmGlooBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  return world_->broadcast(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ShmGlooBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  return world_->_allgather_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> ShmGlooBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::ReduceScatterOptions& opts) {
  return world_->_reduce_scatter_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> ShmGlooBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                            std::vector<int64_t>& output_splits,
                                                            std::vector<int64_t>& input_splits,
                                                            const c10d::AllToAllOptions& opts) {
  return world_->alltoall_base(output, input, output_splits, input_splits, opts);
}

c10::intrusive_ptr<c10d::Work> ShmGlooBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  return world_->reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ShmGlooBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  return world_->gather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ShmGlooBackend::scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      const c10d::ScatterOptions& opts) {
  return world_->scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ShmGlooBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  return world_->send(tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> ShmGlooBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  return world_->recv(tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> ShmGlooBackend::barrier(const c10d::BarrierOptions& opts) {
  host_->barrier(c10d::BarrierOptions());  // after the all-reduces issued before it
  return world_->barrier(opts);
}

}  // namespace lightning::fabric::internal
