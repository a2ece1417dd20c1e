// Collective's ops from one source rank: broadcast_, broadcast_many_, broadcast_bytes and scatter_.
#include "lightning/fabric/plugins/collectives/collective_impl.h"

#include <cstring>

#include <algorithm>
#include <string>
#include <vector>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

void Collective::broadcast_(at::Tensor& tensor, int src) {
  collective_detail::Staged stage(tensor, impl_->device);
  std::vector<at::Tensor> one{stage.work};
  c10d::BroadcastOptions options;
  options.rootRank = src;
  run_blocking(collective_detail::kBroadcast, &stage.work, [&] { return impl_->group->broadcast(one, options); });
  stage.write_back();
}

void Collective::broadcast_many_(const std::vector<at::Tensor>& tensors, int src, size_t bucket_bytes) {
  constexpr int64_t kAlignment = 16;  // each tensor's bytes start aligned for any dtype's view
  const auto aligned = [](int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; };
  size_t begin = 0;
  while (begin < tensors.size()) {
    const at::Device device = tensors[begin].device();
    size_t end = begin + 1;
    int64_t bytes = aligned(static_cast<int64_t>(tensors[begin].nbytes()));
    while (end < tensors.size() && tensors[end].device() == device &&
           static_cast<size_t>(bytes + aligned(static_cast<int64_t>(tensors[end].nbytes()))) <= bucket_bytes) {
      bytes += aligned(static_cast<int64_t>(tensors[end++].nbytes()));
    }
    if (bytes == 0) {  // nothing but empty tensors
      begin = end;
      continue;
    }
    // One broadcast of the bucket's bytes, whatever their dtypes (PyTorch sends one per dtype).
    at::Tensor bucket = at::empty({bytes}, at::TensorOptions(at::kByte).device(device));
    std::vector<int64_t> offsets;
    int64_t offset = 0;
    // CPU tensors in one piece are packed and unpacked with memcpy: a tiny model's buffers are a
    // few hundred bytes, where ATen's per-op dispatch would cost more than the broadcast.
    const auto plain = [&device](const at::Tensor& tensor) { return device.is_cpu() && tensor.is_contiguous(); };
    for (size_t i = begin; i < end; ++i) {
      const at::Tensor& tensor = tensors[i];
      const int64_t size = static_cast<int64_t>(tensor.nbytes());
      if (size > 0 && plain(tensor)) {
        std::memcpy(bucket.data_ptr<uint8_t>() + offset, tensor.data_ptr(), static_cast<size_t>(size));
      } else if (size > 0) {
        bucket.narrow(0, offset, size).copy_(tensor.contiguous().view(-1).view(at::kByte));
      }
      offsets.push_back(offset);
      offset += aligned(size);
    }
    broadcast_(bucket, src);
    for (size_t i = begin; i < end; ++i) {
      at::Tensor target = tensors[i];
      const int64_t size = static_cast<int64_t>(target.nbytes());
      if (size == 0) continue;
      if (plain(target)) {
        std::memcpy(target.data_ptr(), bucket.data_ptr<uint8_t>() + offsets[i - begin], static_cast<size_t>(size));
      } else {
        target.copy_(bucket.narrow(0, offsets[i - begin], size).view(target.scalar_type()).view(target.sizes()));
      }
    }
    begin = end;
  }
}

std::string Collective::broadcast_bytes(const std::string& bytes, int src) {
  // CPU tensors: broadcast_ stages them through the group's device.
  at::Tensor size = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  broadcast_(size, src);
  const int64_t count = size.item<int64_t>();
  at::Tensor data = at::empty({count}, at::kByte);
  if (impl_->rank == src) std::copy(bytes.begin(), bytes.end(), data.data_ptr<uint8_t>());
  if (count > 0) broadcast_(data, src);
  return std::string(reinterpret_cast<const char*>(data.data_ptr<uint8_t>()), static_cast<size_t>(count));
}

std::vector<std::string> Collective::gather_bytes(const std::string& bytes, int dst) {
  LF_CHECK(dst >= -1 && dst < impl_->world_size, ValueError, "gather_bytes: destination ", dst,
           " is not a rank of the group (0..", impl_->world_size - 1, ") nor -1 (every rank).");
  at::Tensor longest = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  all_reduce_(longest, ReduceOp::Max);
  const int64_t width = static_cast<int64_t>(sizeof(int64_t)) + longest.item<int64_t>();
  at::Tensor row = at::zeros({width}, at::kByte);  // this rank's length, then its bytes
  const int64_t length = static_cast<int64_t>(bytes.size());
  std::memcpy(row.data_ptr<uint8_t>(), &length, sizeof(length));
  std::copy(bytes.begin(), bytes.end(), row.data_ptr<uint8_t>() + sizeof(length));
  const at::Tensor rows = dst < 0 ? all_gather(row) : gather(row, dst);
  std::vector<std::string> every_rank;
  if (dst >= 0 && impl_->rank != dst) return every_rank;
  for (int rank = 0; rank < impl_->world_size; ++rank) {
    const auto* start = rows[rank].data_ptr<uint8_t>();
    int64_t size = 0;
    std::memcpy(&size, start, sizeof(size));
    every_rank.emplace_back(reinterpret_cast<const char*>(start) + sizeof(size), static_cast<size_t>(size));
  }
  return every_rank;
}

at::Tensor& Collective::scatter_(at::Tensor& output, const at::Tensor& rows, int src) {
  LF_CHECK(src >= 0 && src < impl_->world_size, ValueError, "scatter: source ", src, " is not a rank of the group (0..",
           impl_->world_size - 1, ").");
  if (impl_->rank == src) {
    std::vector<int64_t> shape{impl_->world_size};
    shape.insert(shape.end(), output.sizes().begin(), output.sizes().end());
    LF_CHECK(rows.defined() && rows.sizes() == at::IntArrayRef(shape) && rows.scalar_type() == output.scalar_type(),
             ValueError, "scatter: the source rank's rows must be ", c10::toString(output.scalar_type()), shape,
             " (one row shaped like the output per rank of the group), got ",
             rows.defined() ? c10::str(c10::toString(rows.scalar_type()), rows.sizes()) : std::string("none"), ".");
  }
  if (impl_->world_size == 1 || output.numel() == 0) {
    if (impl_->world_size == 1) output.copy_(rows[0]);
    return output;
  }
  collective_detail::Staged stage(output, impl_->device);
  if (impl_->backend == ProcessGroupBackend::Shm) {  // shm has no scatter: every rank gets the rows, keeps its own
    at::Tensor all = impl_->rank == src ? rows.to(impl_->device).contiguous().clone()
                                        : at::empty({impl_->world_size * output.numel()}, stage.work.options());
    all = all.view({impl_->world_size, -1});
    broadcast_(all, src);
    stage.work.view(-1).copy_(all[impl_->rank]);
  } else {
    std::vector<at::Tensor> outputs{stage.work};
    std::vector<std::vector<at::Tensor>> inputs;
    if (impl_->rank == src) inputs.emplace_back(rows.to(impl_->device).contiguous().unbind(0));
    c10d::ScatterOptions options;
    options.rootRank = src;
    run_blocking(collective_detail::kScatter, &stage.work,
                 [&] { return impl_->group->scatter(outputs, inputs, options); });
  }
  stage.write_back();
  return output;
}

}  // namespace lightning::fabric
