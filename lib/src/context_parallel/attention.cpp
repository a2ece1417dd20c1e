// Context parallelism's model-side calls (attention.h): the current region, and attention and
// positions that follow it.
#include "lightning/fabric/context_parallel/attention.h"

#include <ATen/ATen.h>

#include "lightning/fabric/context_parallel/ring_attention.h"
#include "lightning/fabric/strategies/device_mesh.h"

namespace lightning::fabric::context_parallel {

namespace {
thread_local const Region* current_region = nullptr;
}

Region::Region(const DeviceMesh* mesh, bool load_balance)
    : mesh_(mesh), load_balance_(load_balance), enclosing_(current_region) {
  if (mesh_ != nullptr && mesh_->has("context")) {
    size_ = mesh_->size("context");
    rank_ = mesh_->coordinate("context");
  }
  current_region = this;
}

Region::~Region() { current_region = enclosing_; }

const Region* Region::current() { return current_region; }

at::Tensor Region::shard(const at::Tensor& full, int64_t dim) const {
  return size_ > 1 ? shard_sequence(full, dim, *mesh_, load_balance_) : full;
}

at::Tensor Region::unshard(const at::Tensor& local, int64_t dim) const {
  return size_ > 1 ? unshard_sequence(local, dim, *mesh_, load_balance_) : local;
}

at::Tensor attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, bool causal) {
  const Region* region = Region::current();
  if (region != nullptr && region->size() > 1) {
    return ring_attention(query, key, value, *region->mesh(), causal, region->load_balance());
  }
  return at::scaled_dot_product_attention(query, key, value, /*attn_mask=*/{}, /*dropout_p=*/0.0, causal);
}

at::Tensor positions(int64_t local_length, c10::Device device) {
  const Region* region = Region::current();
  const int size = region != nullptr ? region->size() : 1;
  const at::Tensor all = at::arange(local_length * size, at::TensorOptions().dtype(at::kLong).device(device));
  return size > 1 ? region->shard(all, 0) : all;
}

}  // namespace lightning::fabric::context_parallel
