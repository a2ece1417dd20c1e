// Collective's point-to-point ops: send, recv_, send_start, recv_start_ (on shm through its pair
// rings, shm_point_to_point.h).
#include "lightning/fabric/plugins/collectives/collective_impl.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/shm_backend.h"

namespace lightning::fabric {

c10::intrusive_ptr<c10d::Work> Collective::point_to_point(
    int peer, const std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&, int)>& issue) {
  return issue(*impl_->group, peer);
}

void Collective::send(const at::Tensor& tensor, int dst) {
  LF_CHECK(dst >= 0 && dst < impl_->world_size && dst != impl_->rank, ValueError, "send: destination ", dst,
           " must be another rank of the group (0..", impl_->world_size - 1, ", not this rank ", impl_->rank, ").");
  std::vector<at::Tensor> one{tensor.to(impl_->device).contiguous()};
  run_blocking(collective_detail::kSend, &one[0], [&] {
    return point_to_point(dst, [&](c10d::Backend& group, int peer) { return group.send(one, peer, 0); });
  });
}

void Collective::recv_(at::Tensor& tensor, int src) {
  LF_CHECK(src >= 0 && src < impl_->world_size && src != impl_->rank, ValueError, "recv: source ", src,
           " must be another rank of the group (0..", impl_->world_size - 1, ", not this rank ", impl_->rank, ").");
  collective_detail::Staged stage(tensor, impl_->device);
  std::vector<at::Tensor> one{stage.work};
  run_blocking(collective_detail::kRecv, &stage.work, [&] {
    return point_to_point(src, [&](c10d::Backend& group, int peer) { return group.recv(one, peer, 0); });
  });
  stage.write_back();
}

std::function<void()> Collective::send_start(const at::Tensor& tensor, int dst, int tag) {
  return start_point_to_point(collective_detail::kSend, tensor, dst, tag);
}

std::function<void()> Collective::recv_start_(at::Tensor& tensor, int src, int tag) {
  return start_point_to_point(collective_detail::kRecv, tensor, src, tag);
}

std::function<void()> Collective::start_point_to_point(int op, const at::Tensor& tensor, int peer, int tag) {
  const char* call = op == collective_detail::kSend ? "send_start" : "recv_start_";
  LF_CHECK(peer >= 0 && peer < impl_->world_size && peer != impl_->rank, ValueError, call, ": peer ", peer,
           " must be another rank of the group (0..", impl_->world_size - 1, ", not this rank ", impl_->rank, ").");
  LF_CHECK(tensor.device() == impl_->device && tensor.is_contiguous() && tag >= 0, ValueError, call, ": the tensor "
           "must be contiguous and on the group's device ", impl_->device, " and the tag non-negative; got ",
           tensor.device(), tensor.is_contiguous() ? "" : " (not contiguous)", ", tag ", tag, ".");
  const uint64_t seq = begin_async(op, tensor);
  std::vector<at::Tensor> one{tensor};
  auto work = collective_detail::issue_recorded(impl_->recorder, seq, /*runs_in_call=*/false, [&] {
    return point_to_point(peer, [&](c10d::Backend& group, int rank) {
      return op == collective_detail::kSend ? group.send(one, rank, tag) : group.recv(one, rank, tag);
    });
  });
  return [this, work, seq, one] { wait_recorded(work, seq); };  // one: the bytes stay alive until done
}

void Collective::connect_point_to_point(const std::vector<int>& peers) {
  // gloo and nccl connect within the group itself; shm makes the pairs' rings now.
  if (auto* shm = dynamic_cast<internal::ShmBackend*>(impl_->group.get())) shm->connect(peers);
}

}  // namespace lightning::fabric
