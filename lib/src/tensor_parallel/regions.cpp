#include "lightning/fabric/tensor_parallel/regions.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/device_mesh.h"

namespace lightning::fabric::tensor_parallel {
namespace {

enum class Move { Identity, AllReduce, AllGather, Slice, ReduceScatter };

int64_t checked_dim(const at::Tensor& tensor, int64_t dim) {
  LF_CHECK(tensor.dim() > 0, ValueError, "tensor parallel: a region along a dimension needs a tensor with at least "
           "one dimension, got a scalar.");
  return at::maybe_wrap_dim(dim, tensor.dim());
}

at::Tensor slice_of(const at::Tensor& full, int size, int rank, int64_t dim) {
  dim = checked_dim(full, dim);
  LF_CHECK(full.size(dim) % size == 0, ValueError, "tensor parallel: dimension ", dim, " of size ", full.size(dim),
           " does not split into ", size, " equal parts (the tensor-parallel size). Make it a multiple of ", size, ".");
  return full.chunk(size, dim)[rank].contiguous();
}

at::Tensor gathered(const at::Tensor& part, Collective& group, int64_t dim) {
  dim = checked_dim(part, dim);
  const at::Tensor all = group.all_gather(part.contiguous());  // [size, ...part]
  return all.movedim(0, dim).flatten(dim, dim + 1);
}

at::Tensor reduce_scattered(const at::Tensor& full, Collective& group, int64_t dim) {
  dim = checked_dim(full, dim);
  const int size = group.world_size();
  LF_CHECK(full.size(dim) % size == 0, ValueError, "tensor parallel: dimension ", dim, " of size ", full.size(dim),
           " does not split into ", size, " equal parts (the tensor-parallel size) for a reduce-scatter.");
  std::vector<at::Tensor> rows;
  for (const auto& part : full.chunk(size, dim)) rows.push_back(part.contiguous().view(-1));
  std::vector<int64_t> shape = full.sizes().vec();
  shape[dim] /= size;
  return group.reduce_scatter(at::stack(rows), ReduceOp::Sum).view(shape);
}

at::Tensor move(Move how, const at::Tensor& tensor, Collective& group, int64_t dim) {
  if (group.world_size() == 1) return tensor;
  switch (how) {
    case Move::Identity: return tensor;
    case Move::AllReduce: {
      at::Tensor result = tensor.contiguous().clone();
      group.all_reduce_(result, ReduceOp::Sum);
      return result;
    }
    case Move::AllGather: return gathered(tensor, group, dim);
    case Move::Slice: return slice_of(tensor, group.world_size(), group.rank(), dim);
    case Move::ReduceScatter: return reduce_scattered(tensor, group, dim);
  }
  return tensor;
}

// What the backward needs: the group and how to move the gradient.
struct RegionCall : torch::CustomClassHolder {
  Collective* group = nullptr;
  Move backward = Move::Identity;
  int64_t dim = 0;
};

struct Region : torch::autograd::Function<Region> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<RegionCall> call, Move forward_move,
                            const at::Tensor& input) {
    at::Tensor output = move(forward_move, input, *call->group, call->dim);
    ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
    return output;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto call = ctx->saved_data["call"].toCapsule();
    auto* region = static_cast<RegionCall*>(call.get());
    return {at::Tensor(), at::Tensor(), move(region->backward, grads[0], *region->group, region->dim)};
  }
};

at::Tensor region(const at::Tensor& input, const DeviceMesh& mesh, Move forward_move, Move backward_move, int64_t dim) {
  if (forward_move != Move::Identity && forward_move != Move::AllReduce) dim = checked_dim(input, dim);
  auto call = c10::make_intrusive<RegionCall>();
  call->group = &mesh.group("tensor");
  call->backward = backward_move;
  call->dim = dim;
  return Region::apply(std::move(call), forward_move, input);
}
}  // namespace

at::Tensor copy_to_tensor_region(const at::Tensor& input, const DeviceMesh& mesh) {
  return region(input, mesh, Move::Identity, Move::AllReduce, 0);
}
at::Tensor reduce_from_tensor_region(const at::Tensor& input, const DeviceMesh& mesh) {
  return region(input, mesh, Move::AllReduce, Move::Identity, 0);
}
at::Tensor gather_from_tensor_region(const at::Tensor& input, const DeviceMesh& mesh, int64_t dim) {
  return region(input, mesh, Move::AllGather, Move::Slice, dim);
}
at::Tensor scatter_to_tensor_region(const at::Tensor& input, const DeviceMesh& mesh, int64_t dim) {
  return region(input, mesh, Move::Slice, Move::AllGather, dim);
}
at::Tensor gather_from_sequence_region(const at::Tensor& input, const DeviceMesh& mesh, int64_t dim) {
  return region(input, mesh, Move::AllGather, Move::ReduceScatter, dim);
}
at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& input, const DeviceMesh& mesh, int64_t dim) {
  return region(input, mesh, Move::ReduceScatter, Move::AllGather, dim);
}

at::Tensor tensor_slice(const at::Tensor& full, const DeviceMesh& mesh, int64_t dim) {
  return slice_of(full, mesh.size("tensor"), mesh.coordinate("tensor"), dim);
}

}  // namespace lightning::fabric::tensor_parallel
