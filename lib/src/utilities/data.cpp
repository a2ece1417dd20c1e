#include "lightning/fabric/utilities/data.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randperm.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <algorithm>
#include <numeric>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

DistributedSampler::DistributedSampler(size_t dataset_size, int num_replicas, int rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  LF_CHECK(num_replicas > 0, ValueError, "DistributedSampler: num_replicas=", num_replicas, " must be > 0.");
  LF_CHECK(rank >= 0 && rank < num_replicas, ValueError, "DistributedSampler: rank=", rank,
           " is outside [0, ", num_replicas - 1, "] for num_replicas=", num_replicas, ".");
  build_indices();
}

DistributedSampler::DistributedSampler(OrderSource source, int num_replicas, int rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : DistributedSampler(0, num_replicas, rank, shuffle, seed, drop_last) {
  LF_CHECK(source != nullptr, ValueError, "DistributedSampler: no order source given.");
  source_ = std::move(source);
  build_indices();
}

size_t DistributedSampler::num_samples() const {
  const size_t replicas = static_cast<size_t>(num_replicas_);
  if (drop_last_) return dataset_size_ / replicas;
  return (dataset_size_ + replicas - 1) / replicas;
}

void DistributedSampler::build_indices() {
  std::vector<size_t> drawn;  // the source's indices, in its order; positions into it below
  if (source_) {
    drawn = source_(epoch_);
    dataset_size_ = drawn.size();
  }
  std::vector<size_t> order(dataset_size_);
  if (shuffle_ && dataset_size_ > 0) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch_));
    const at::Tensor permutation = at::randperm(static_cast<int64_t>(dataset_size_), generator, at::kLong);
    const int64_t* data = permutation.data_ptr<int64_t>();
    std::copy(data, data + dataset_size_, order.begin());
  } else {
    std::iota(order.begin(), order.end(), size_t{0});
  }
  if (source_) {
    for (size_t& position : order) position = drawn[position];
  }
  const size_t total = num_samples() * static_cast<size_t>(num_replicas_);
  if (total > order.size() && !order.empty()) {  // pad by wrapping around, as PyTorch does
    const size_t original = order.size();
    for (size_t i = 0; order.size() < total; ++i) order.push_back(order[i % original]);
  }
  order.resize(total);
  indices_.clear();
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(num_replicas_)) {
    indices_.push_back(order[i]);
  }
  cursor_ = 0;
}

void DistributedSampler::reset(c10::optional<size_t> new_size) {
  if (new_size) dataset_size_ = *new_size;
  if (control_->next_epoch) {
    epoch_ = *control_->next_epoch;
    control_->next_epoch.reset();
  } else if (started_) {
    ++epoch_;
  }
  started_ = true;
  build_indices();
  cursor_ = std::min(indices_.size(), static_cast<size_t>(std::max<int64_t>(control_->skip, 0)));
  control_->applied_skip = static_cast<int64_t>(cursor_);
  control_->skip = 0;
  control_->epoch = epoch_;
}

c10::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  if (cursor_ >= indices_.size()) return c10::nullopt;
  const size_t end = std::min(indices_.size(), cursor_ + batch_size);
  std::vector<size_t> batch(indices_.begin() + static_cast<std::ptrdiff_t>(cursor_),
                            indices_.begin() + static_cast<std::ptrdiff_t>(end));
  cursor_ = end;
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", torch::tensor(epoch_, torch::kInt64), /*is_buffer=*/true);
  archive.write("cursor", torch::tensor(static_cast<int64_t>(cursor_), torch::kInt64), /*is_buffer=*/true);
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  at::Tensor epoch, cursor;
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("cursor", cursor, /*is_buffer=*/true);
  epoch_ = epoch.item<int64_t>();
  control_->epoch = epoch_;
  started_ = true;
  build_indices();
  cursor_ = static_cast<size_t>(cursor.item<int64_t>());
}

}  // namespace lightning::fabric
