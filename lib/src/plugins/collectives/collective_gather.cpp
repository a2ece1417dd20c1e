// Collective's gathers: all_gather (blocking and started), gather and all_to_all.
#include "lightning/fabric/plugins/collectives/collective_impl.h"

#include <vector>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/shm_backend.h"

namespace lightning::fabric {

at::Tensor Collective::all_gather(const at::Tensor& tensor) {
  std::vector<int64_t> shape{impl_->world_size};
  shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  // Nothing to move (and gloo divides by the element count) when every rank's part is empty:
  // LT_CHECK_COLLECTIVES=1 confirms that the others are empty too.
  if (tensor.numel() == 0) {
    auto scope = collective_detail::record(impl_->recorder, "all_gather", impl_->name, &tensor);
    check_call(collective_detail::kAllGather, &tensor);
    return at::empty(shape, tensor.options());
  }
  // Flat on both sides: c10d splits the output into world_size chunks shaped like the input.
  at::Tensor input = tensor.to(impl_->device).contiguous().view(-1);
  at::Tensor output = at::empty({impl_->world_size * input.numel()}, input.options());
  run_blocking(collective_detail::kAllGather, &tensor, [&] { return impl_->group->_allgather_base(output, input); });
  return output.view(shape).to(tensor.device());
}

std::function<at::Tensor()> Collective::all_gather_start(const at::Tensor& tensor) {
  if (tensor.numel() == 0 || impl_->world_size == 1) {
    at::Tensor result = all_gather(tensor);
    return [result] { return result; };
  }
  std::vector<int64_t> shape{impl_->world_size};
  shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  at::Tensor input = tensor.to(impl_->device).contiguous().view(-1);
  at::Tensor output = at::empty({impl_->world_size * input.numel()}, input.options());
  flight::Recorder* recorder = impl_->recorder;
  const uint64_t seq = begin_async(collective_detail::kAllGather, tensor);
  auto* shm = dynamic_cast<internal::ShmBackend*>(impl_->group.get());
  auto work = collective_detail::issue_recorded(
      recorder, seq, /*runs_in_call=*/false, [&]() -> c10::intrusive_ptr<c10d::Work> {
        if (shm == nullptr) return impl_->group->_allgather_base(output, input);
        return shm->in_background(c10d::OpType::_ALLGATHER_BASE, [shm, output, input]() mutable {
          shm->_allgather_base(output, input, c10d::AllgatherOptions());
        });
      });
  return [this, work, seq, output, shape, device = tensor.device()] {
    wait_recorded(work, seq);
    return output.view(shape).to(device);
  };
}

at::Tensor Collective::gather(const at::Tensor& tensor, int dst) {
  LF_CHECK(dst >= 0 && dst < impl_->world_size, ValueError, "gather: destination ", dst, " is not a rank of the group (0..",
           impl_->world_size - 1, ").");
  if (impl_->world_size == 1 || impl_->backend == ProcessGroupBackend::Shm || tensor.numel() == 0) {
    at::Tensor all = all_gather(tensor);  // shm has no gather: every rank gathers, dst keeps it
    return impl_->rank == dst ? all : at::Tensor();
  }
  at::Tensor input = tensor.to(impl_->device).contiguous();
  std::vector<at::Tensor> inputs{input};
  std::vector<std::vector<at::Tensor>> outputs;
  at::Tensor stacked;
  if (impl_->rank == dst) {
    std::vector<int64_t> shape{impl_->world_size};
    shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
    stacked = at::empty(shape, input.options());
    outputs.emplace_back(stacked.unbind(0));
  }
  c10d::GatherOptions options;
  options.rootRank = dst;
  run_blocking(collective_detail::kGather, &input, [&] { return impl_->group->gather(outputs, inputs, options); });
  return impl_->rank == dst ? stacked.to(tensor.device()) : at::Tensor();
}

at::Tensor Collective::all_to_all(const at::Tensor& tensor) {
  LF_CHECK(tensor.numel() % impl_->world_size == 0, ValueError, "all_to_all: ", tensor.numel(),
           " elements do not split into ", impl_->world_size, " equal parts.");
  at::Tensor input = tensor.to(impl_->device).contiguous().view(-1);
  at::Tensor output = at::empty_like(input);
  if (input.numel() > 0) {
    std::vector<int64_t> equal;
    run_blocking(collective_detail::kAllToAll, &input,
                 [&] { return impl_->group->alltoall_base(output, input, equal, equal); });
  }
  return output.to(tensor.device());
}

}  // namespace lightning::fabric
