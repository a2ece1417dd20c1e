// Data loading helpers behind Fabric::setup_dataloaders: the distributed sampler every rank uses
// to read its own share of a dataset, reshuffled each epoch.
#pragma once

#include "lightning/fabric/export.h"

#include <torch/data/samplers/base.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace lightning::fabric {

/// Splits dataset indices over num_replicas ranks, as PyTorch's DistributedSampler: with
/// shuffle, a permutation seeded by seed + epoch (identical on every rank); without drop_last
/// the index list is padded by wrapping around so every rank gets ceil(N / replicas) samples.
/// Each reset() (a data loader calls it when an epoch's iteration begins) advances the epoch,
/// so every epoch is shuffled differently, as Fabric's set_epoch does.
class LF_API DistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  DistributedSampler(size_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);

  void reset(c10::optional<size_t> new_size = c10::nullopt) override;
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// The epoch the current (or next, before the first reset) pass uses.
  int64_t epoch() const { return epoch_; }
  /// The next pass (reset) uses this epoch's order instead of the one after the current: for
  /// resuming, as PyTorch's set_epoch. Copies of this sampler (the one inside a data loader)
  /// share the setting.
  void set_epoch(int64_t epoch) { *next_epoch_ = epoch; }
  /// Samples this rank yields per epoch.
  size_t num_samples() const;
  /// This rank's indices for the current epoch.
  const std::vector<size_t>& indices() const { return indices_; }

 private:
  void build_indices();

  size_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  std::shared_ptr<std::optional<int64_t>> next_epoch_ = std::make_shared<std::optional<int64_t>>();
  bool started_ = false;
  size_t cursor_ = 0;
  std::vector<size_t> indices_;
};

}  // namespace lightning::fabric
