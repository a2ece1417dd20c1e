// Data loading helpers behind Fabric::setup_dataloaders: the distributed sampler every rank uses
// to read its own share of a dataset (of its indices, or of the order a sampler of yours draws),
// reshuffled each epoch, and the split of a stream (a dataset with no size) over the ranks.
#pragma once

#include "lightning/fabric/export.h"

#include <torch/data/datasets/stateful.h>
#include <torch/data/samplers/base.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace lightning::fabric {

/// What a loader's sampler (or stream) shares with its copies and with Fabric: the epoch of the
/// current pass, a set_epoch waiting for the next pass, and what the next pass skips at its start
/// (exact resume, checkpoint/resume_state.h): this rank's samples for a DistributedSampler, items
/// of the source's sequence for a ShardedStream.
struct PassControl {
  std::optional<int64_t> next_epoch;
  int64_t epoch = 0;
  int64_t skip = 0;
  int64_t applied_skip = 0;  // the skip the current pass started with
};

/// Where a loader Fabric set up stands, counted where the loop takes its batches (a loader's
/// workers read ahead): what exact resume saves and restores.
struct LoaderProgress {
  std::shared_ptr<PassControl> control;
  bool stream = false;          // skip counts the source's items, not this rank's samples
  int64_t units_per_batch = 1;  // samples (a stream: items) in a full batch
  int64_t replicas = 1;         // ranks the data is split over (the sampler's num_replicas)
  int64_t rank = 0;             // this rank's place among them
  bool started = false;         // a pass has begun
  bool finished = false;        // ... and was read to its end
  int64_t batches = 0;          // batches taken in the current pass
  int64_t skipped = 0;          // this rank's samples (a stream: items) the pass skipped at its start

  /// A pass began (after the sampler's or stream's reset).
  void begin_pass() {
    started = true;
    finished = false;
    batches = 0;
    skipped = stream ? items_of(control->applied_skip) : control->applied_skip;
  }
  /// A stream: this rank's items among the first `position` of the source's sequence.
  int64_t items_of(int64_t position) const { return position > rank ? (position - rank + replicas - 1) / replicas : 0; }
  /// This rank's samples (a stream: items) of the current pass behind the loop, skipped ones included.
  int64_t taken() const { return skipped + batches * units_per_batch; }
};

/// Splits dataset indices over num_replicas ranks, as PyTorch's DistributedSampler: with
/// shuffle, a permutation seeded by seed + epoch (identical on every rank); without drop_last
/// the index list is padded by wrapping around so every rank gets ceil(N / replicas) samples.
/// Each reset() (a data loader calls it when an epoch's iteration begins) advances the epoch,
/// so every epoch is shuffled differently, as Fabric's set_epoch does.
class LF_API DistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  DistributedSampler(size_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);
  /// The epoch's indices in the order source(epoch) draws them (Python's DistributedSamplerWrapper
  /// over your sampler): the list is split, padded and (with shuffle) permuted by position as the
  /// indices 0..N-1 are above. Drawn at construction and at every reset; every rank must draw the
  /// same list for an epoch. See distribute_sampler.
  using OrderSource = std::function<std::vector<size_t>(int64_t epoch)>;
  DistributedSampler(OrderSource source, int num_replicas, int rank, bool shuffle = false, uint64_t seed = 0,
                     bool drop_last = false);

  void reset(c10::optional<size_t> new_size = c10::nullopt) override;
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// The epoch the current (or next, before the first reset) pass uses.
  int64_t epoch() const { return epoch_; }
  /// The next pass (reset) uses this epoch's order instead of the one after the current: for
  /// resuming, as PyTorch's set_epoch. Copies of this sampler (the one inside a data loader)
  /// share the setting.
  void set_epoch(int64_t epoch) { control_->next_epoch = epoch; }
  /// The epoch and skip that copies of this sampler share (see PassControl).
  const std::shared_ptr<PassControl>& pass_control() const { return control_; }
  /// Samples this rank yields per epoch.
  size_t num_samples() const;
  /// Ranks the indices are split over, and this one's place among them.
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }
  /// This rank's indices for the current epoch.
  const std::vector<size_t>& indices() const { return indices_; }

 private:
  void build_indices();

  OrderSource source_;  // null: the indices 0..dataset_size_-1
  size_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  std::shared_ptr<PassControl> control_ = std::make_shared<PassControl>();
  bool started_ = false;
  size_t cursor_ = 0;
  std::vector<size_t> indices_;
};

namespace detail {
template <class T, class = void> struct HasSetEpoch : std::false_type {};
template <class T>
struct HasSetEpoch<T, std::void_t<decltype(std::declval<T&>().set_epoch(int64_t{}))>> : std::true_type {};
template <class T> struct IsVector : std::false_type {};
template <class T, class A> struct IsVector<std::vector<T, A>> : std::true_type {};
// A stream's item: an element of its batch when that is a vector, else the batch.
template <class Batch, bool = IsVector<Batch>::value> struct StreamItem { using type = Batch; };
template <class Batch> struct StreamItem<Batch, true> { using type = typename Batch::value_type; };
template <class T, class = void> struct HasSave : std::false_type {};
template <class T>
struct HasSave<T, std::void_t<decltype(std::declval<const T&>().save(std::declval<torch::serialize::OutputArchive&>()))>>
    : std::true_type {};
}  // namespace detail

/// A DistributedSampler over the indices your sampler yields (Python wraps any sampler so): at
/// each epoch it calls sampler.set_epoch(epoch) when the sampler has one, then reset() and next()
/// until the sampler is exhausted. The sampler must yield the same indices on every rank (seed
/// any randomness from the epoch), and must end.
template <class Sampler>
DistributedSampler distribute_sampler(Sampler sampler, int num_replicas, int rank, bool shuffle = false,
                                      uint64_t seed = 0, bool drop_last = false) {
  static_assert(std::is_base_of_v<torch::data::samplers::Sampler<>, Sampler>,
                "distribute_sampler: the sampler must derive from torch::data::samplers::Sampler<> (index batches)");
  auto inner = std::make_shared<Sampler>(std::move(sampler));
  auto draw = [inner](int64_t epoch) {
    if constexpr (detail::HasSetEpoch<Sampler>::value) inner->set_epoch(epoch);
    inner->reset(std::nullopt);
    std::vector<size_t> order;
    while (auto batch = inner->next(1024)) order.insert(order.end(), batch->begin(), batch->end());
    return order;
  };
  return DistributedSampler(DistributedSampler::OrderSource(std::move(draw)), num_replicas, rank, shuffle, seed, drop_last);
}

/// A stream (a LibTorch StatefulDataset: no size, batches until it runs out) split over ranks:
/// rank r keeps items r, r + W, r + 2W, ... of the source's sequence (W: num_replicas), so every
/// item is read by exactly one rank and nothing is padded: ranks may get different counts (at
/// most one item apart). An item is an element of the source's batch when that is a std::vector,
/// else a whole batch. Each reset() starts an epoch: the source gets set_epoch(epoch) (when it has
/// one) and reset(). Copies share one source, which may be read from several worker threads.
template <class Source>
class ShardedStream
    : public torch::data::datasets::StatefulDataset<ShardedStream<Source>, typename Source::BatchType::value_type, size_t> {
 public:
  using SourceBatch = typename Source::BatchType::value_type;

  ShardedStream(Source source, int num_replicas, int rank) : shared_(std::make_shared<Shared>(std::move(source))) {
    shared_->replicas = num_replicas;
    shared_->rank = rank;
  }
  /// The epoch and skip that copies of this stream share (see PassControl; skip: source items).
  const std::shared_ptr<PassControl>& pass_control() const { return shared_->control; }

  std::optional<SourceBatch> get_batch(size_t batch_size) override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if constexpr (detail::IsVector<SourceBatch>::value) {
      SourceBatch batch;
      while (batch.size() < batch_size) {
        if (shared_->pending.empty() && !pull(batch_size)) break;
        batch.push_back(std::move(shared_->pending.front()));
        shared_->pending.pop_front();
      }
      if (batch.empty()) return std::nullopt;
      return batch;
    } else {
      if (shared_->pending.empty() && !pull(batch_size)) return std::nullopt;
      SourceBatch batch = std::move(shared_->pending.front());
      shared_->pending.pop_front();
      return batch;
    }
  }
  std::optional<size_t> size() const override { return std::nullopt; }
  void reset() override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    PassControl& control = *shared_->control;
    if (control.next_epoch) {
      control.epoch = *control.next_epoch;
      control.next_epoch.reset();
    } else if (shared_->started) {
      ++control.epoch;
    }
    shared_->started = true;
    if constexpr (detail::HasSetEpoch<Source>::value) shared_->source.set_epoch(control.epoch);
    shared_->source.reset();
    shared_->position = 0;
    shared_->to_drop = control.applied_skip = control.skip;
    control.skip = 0;
    shared_->pending.clear();
  }
  /// The source's own save and load, when it has them (a mapped stream does not).
  void save(torch::serialize::OutputArchive& archive) const override {
    if constexpr (detail::HasSave<Source>::value) shared_->source.save(archive);
  }
  void load(torch::serialize::InputArchive& archive) override {
    if constexpr (detail::HasSave<Source>::value) shared_->source.load(archive);
  }
  /// The next epoch (reset) is `epoch` instead of the one after the current. Shared by copies.
  void set_epoch(int64_t epoch) {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->control->next_epoch = epoch;
  }

 private:
  using Item = typename detail::StreamItem<SourceBatch>::type;
  struct Shared {
    explicit Shared(Source value) : source(std::move(value)) {}
    Source source;
    int replicas = 1, rank = 0;
    int64_t position = 0;  // items of the source's sequence read so far this epoch
    int64_t to_drop = 0;   // items at the start of this epoch's sequence read before (exact resume)
    std::shared_ptr<PassControl> control = std::make_shared<PassControl>();
    bool started = false;
    std::deque<Item> pending;  // this rank's items read but not yet handed out
    std::mutex mutex;
  };
  // Reads source batches until one of this rank's items is pending; false when the source ended.
  bool pull(size_t batch_size) {
    while (shared_->pending.empty()) {
      auto batch = shared_->source.get_batch(batch_size);
      if (!batch) return false;
      if constexpr (detail::IsVector<SourceBatch>::value) {
        for (auto& item : *batch) keep(std::move(item));
      } else {
        keep(std::move(*batch));
      }
    }
    return true;
  }
  void keep(Item item) {
    if (shared_->to_drop > 0) {
      --shared_->to_drop;
      ++shared_->position;
      return;
    }
    if (shared_->position++ % shared_->replicas == shared_->rank) shared_->pending.push_back(std::move(item));
  }
  std::shared_ptr<Shared> shared_;
};

}  // namespace lightning::fabric
