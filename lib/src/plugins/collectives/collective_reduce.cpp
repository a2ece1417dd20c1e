// Collective's reductions: all_reduce_ (one, many, started), reduce_scatter and reduce.
#include "lightning/fabric/plugins/collectives/collective_impl.h"

#include <vector>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace {
c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return c10d::ReduceOp::SUM;
    case ReduceOp::Mean:
      return c10d::ReduceOp::AVG;
    case ReduceOp::Max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::Min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::Product:
      return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

// Mean as the sum divided by the group's size: c10d's AVG is NCCL's alone for reduce and
// reduce-scatter. Integer tensors have no mean here (as in all_reduce on gloo).
c10d::ReduceOp summed_for_mean(ReduceOp op, const at::Tensor& tensor, const char* call) {
  LF_CHECK(op != ReduceOp::Mean || tensor.is_floating_point() || tensor.is_complex(), ValueError, call, ": mean of a ",
           c10::toString(tensor.scalar_type()), " tensor; use sum (and divide) or pass a floating-point tensor.");
  return op == ReduceOp::Mean ? c10d::ReduceOp(c10d::ReduceOp::SUM) : to_c10d(op);
}
}  // namespace

c10::intrusive_ptr<c10d::Work> Collective::issue_all_reduce(at::Tensor& work, ReduceOp op, uint64_t& seq) {
  flight::Recorder* recorder = impl_->recorder;
  seq = begin_async(collective_detail::kAllReduce, work);
  std::vector<at::Tensor> one{work};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  return collective_detail::issue_recorded(recorder, seq, impl_->ops_run_in_call,
                                           [&] { return impl_->group->allreduce(one, options); });
}

void Collective::all_reduce_many_(std::vector<at::Tensor>& tensors, ReduceOp op) {
  std::vector<collective_detail::Staged> staged;
  staged.reserve(tensors.size());
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<uint64_t> seqs(tensors.size(), 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    staged.emplace_back(tensors[i], impl_->device);
    works.push_back(issue_all_reduce(staged.back().work, op, seqs[i]));
  }
  for (size_t i = 0; i < works.size(); ++i) wait_recorded(works[i], seqs[i]);
  for (auto& stage : staged) stage.write_back();
}

std::function<void()> Collective::all_reduce_start_(at::Tensor& tensor) {
  LF_CHECK(tensor.device() == impl_->device && tensor.is_contiguous(), ValueError, "Collective::all_reduce_start_: "
           "the tensor must be contiguous and on the group's device ", impl_->device, ", got ", tensor.device(), ".");
  uint64_t seq = 0;
  auto work = issue_all_reduce(tensor, ReduceOp::Sum, seq);
  return [this, work, seq]() -> void { wait_recorded(work, seq); };
}

void Collective::all_reduce_(at::Tensor& tensor, ReduceOp op) {
  std::vector<at::Tensor> one{tensor};
  all_reduce_many_(one, op);
}

at::Tensor Collective::reduce_scatter(const at::Tensor& rows, ReduceOp op) {
  LF_CHECK(rows.dim() >= 1 && rows.size(0) == impl_->world_size, ValueError, "reduce_scatter: expected a tensor of ",
           impl_->world_size, " rows (one per rank of the group) in its first dimension, got shape ", rows.sizes(), ".");
  const c10d::ReduceOp reduce_op = summed_for_mean(op, rows, "reduce_scatter");
  if (impl_->world_size == 1) return rows[0].clone();
  at::Tensor input = rows.to(impl_->device).contiguous().view(-1);  // c10d wants it flat
  at::Tensor output = at::empty(rows[0].sizes(), input.options());
  at::Tensor flat_output = output.view(-1);
  c10d::ReduceScatterOptions options;
  options.reduceOp = reduce_op;
  run_blocking(collective_detail::kReduceScatter, &rows,
               [&] { return impl_->group->_reduce_scatter_base(flat_output, input, options); });
  if (op == ReduceOp::Mean) output.div_(impl_->world_size);
  return output.to(rows.device());
}

at::Tensor Collective::reduce(const at::Tensor& tensor, int dst, ReduceOp op) {
  LF_CHECK(dst >= 0 && dst < impl_->world_size, ValueError, "reduce: destination ", dst, " is not a rank of the group (0..",
           impl_->world_size - 1, ").");
  const c10d::ReduceOp reduce_op = summed_for_mean(op, tensor, "reduce");
  at::Tensor work = tensor.to(impl_->device).contiguous().clone();
  if (impl_->world_size > 1) {
    std::vector<at::Tensor> one{work};
    run_blocking(collective_detail::kReduce, &work, [&] {
      if (impl_->backend == ProcessGroupBackend::Shm) {  // shm has no reduce: all ranks get the result
        c10d::AllreduceOptions options;
        options.reduceOp = reduce_op;
        return impl_->group->allreduce(one, options);
      }
      c10d::ReduceOptions options;
      options.reduceOp = reduce_op;
      options.rootRank = dst;
      return impl_->group->reduce(one, options);
    });
  }
  if (impl_->rank != dst) return tensor;
  if (op == ReduceOp::Mean) work.div_(impl_->world_size);
  return work.to(tensor.device());
}

}  // namespace lightning::fabric
