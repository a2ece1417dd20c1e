// StreamingDataLoader: batches of a StreamingDataset for this rank, read ahead by background
// threads, in the order LitData's StreamingDataLoader serves the same folder to a Python job of the
// same topology (world size, num_workers, batch_size, seed, epoch), and resumable mid-epoch:
//
//   lf::StreamingDataset dataset("/data/train");
//   lf::StreamingDataLoader loader(dataset, lf::StreamingLoaderOptions().batch_size(64).shuffle(true));
//   fabric.setup_dataloaders(loader);  // this rank's share of the data ranks; batches on fabric.device()
//   for (auto& batch : loader) {       // one pass = one epoch (the first is epoch 1)
//     auto images = batch.data.toTupleRef().elements()[0].toTensor();   // stacked: [64, ...]
//     ...
//   }
//   fabric.save(path, {{"model", model}, {"resume", fabric.resume_state()}});   // where this pass stands
//
// Every rank takes the same number of batches per pass when drop_last is on (LitData's default
// with more than one rank). Behind Fabric, fabric.resume_state() saves the loader's position
// (rank 0's) with the generators; fabric.load restores it on every rank, and the next pass
// continues with exactly the samples the job had not yet taken, on the same or on another world
// size (docs/data.md, "Resuming"). The loader is also Stateful, to save it as an entry of its own
// without Fabric's set-up.
#pragma once

#include "lightning/fabric/checkpoint/stateful.h"
#include "lightning/fabric/data/streaming_dataset.h"
#include "lightning/fabric/export.h"

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lightning::fabric {

class Fabric;

/// The loader's settings; each setter returns the options for chaining.
struct LF_API StreamingLoaderOptions {
#define LF_STREAMING_OPTION(type, name, initial)                 \
  StreamingLoaderOptions& name(type value) {                     \
    name##_ = value;                                             \
    return *this;                                                \
  }                                                              \
  type name##_ = initial;
  /// Samples per batch (LitData's batch_size).
  LF_STREAMING_OPTION(int64_t, batch_size, 1)
  /// Shuffle chunks and items by (seed, epoch), as LitData's FullShuffle.
  LF_STREAMING_OPTION(bool, shuffle, false)
  /// LitData's seed (0 to 2^32 - 1).
  LF_STREAMING_OPTION(int64_t, seed, 42)
  /// Items shuffled within aligned windows of this many (0: the whole piece), as LitData's
  /// item_shuffle_window.
  LF_STREAMING_OPTION(int64_t, item_shuffle_window, 256)
  /// The number of DataLoader workers whose interleaving the order reproduces (Python's
  /// num_workers; 0 and 1 read alike). It shapes the order only: reading uses `threads`.
  LF_STREAMING_OPTION(int, num_workers, 0)
  /// Ranks that split the dataset, and this one (-1: WORLD_SIZE and RANK from the environment, as
  /// lightning-run and torchrun set them; else 1 and 0). Leave them unset under
  /// fabric.setup_dataloaders, which sets the strategy's data ranks.
  LF_STREAMING_OPTION(int, world_size, -1)
  LF_STREAMING_OPTION(int, rank, -1)
  /// Background threads that read, decode and collate batches.
  LF_STREAMING_OPTION(int, threads, 2)
  /// Batches read ahead of the loop at most.
  LF_STREAMING_OPTION(int, prefetch_batches, 4)
  /// Bytes of read-ahead batches at most (a batch is always allowed when none is waiting).
  LF_STREAMING_OPTION(int64_t, max_prefetch_bytes, int64_t{1} << 30)
  /// An s3:// dataset's chunks downloaded ahead of the chunks being read, by a background thread
  /// (LitData's max_pre_download); fewer when the dataset's cache budget, shared by the node's
  /// LOCAL_WORLD_SIZE processes, cannot hold them beside the chunks being read. 0: no fetch ahead.
  LF_STREAMING_OPTION(int, prefetch_chunks, 2)
  /// Put batches in pinned (page-locked) memory, for fast non-blocking copies to a GPU.
  LF_STREAMING_OPTION(bool, pin_memory, false)
  /// Stack items into batches (tensors along a new first dimension, numbers into tensors, strings
  /// into lists); false leaves batch.data a list of the items.
  LF_STREAMING_OPTION(bool, collate, true)
#undef LF_STREAMING_OPTION
  /// Drop what does not fill whole batches on every rank; default (unset): LitData's, on when
  /// world_size > 1.
  std::optional<bool> drop_last_;
  StreamingLoaderOptions& drop_last(bool value) {
    drop_last_ = value;
    return *this;
  }
};

/// One batch: the collated items and the global indices of its items, in order.
struct StreamingBatch {
  c10::IValue data;
  std::vector<int64_t> indices;
};

/// Python's default_collate for items of one structure: tensors stacked along a new first
/// dimension, ints, doubles and bools into int64, float64 and bool tensors, strings into a list,
/// tuples, lists and dicts collated per position or key. ValueError naming the leaf for tensors
/// of different shapes or leaves of different types.
LF_API c10::IValue collate_items(const std::vector<c10::IValue>& items);

namespace data_detail {
struct LoaderPass;
}

class LF_API StreamingDataLoader : public Stateful {
 public:
  /// The dataset must outlive the loader. ValueError for options out of range.
  StreamingDataLoader(const StreamingDataset& dataset, StreamingLoaderOptions options = {});
  ~StreamingDataLoader() override;
  StreamingDataLoader(const StreamingDataLoader&) = delete;
  StreamingDataLoader& operator=(const StreamingDataLoader&) = delete;

  class LF_API Iterator {
   public:
    StreamingBatch& operator*() const { return *batch_; }
    StreamingBatch* operator->() const { return batch_.get(); }
    Iterator& operator++();
    bool operator!=(const Iterator& other) const { return loader_ != other.loader_; }
    bool operator==(const Iterator& other) const { return loader_ == other.loader_; }

   private:
    friend class StreamingDataLoader;
    StreamingDataLoader* loader_ = nullptr;  // null: the end
    std::shared_ptr<StreamingBatch> batch_;
  };
  /// Starts a pass: the next epoch (or the one set_epoch chose), or the rest of the pass a
  /// loaded state stopped in. One pass at a time; beginning another ends the current one.
  Iterator begin();
  Iterator end() { return Iterator(); }

  /// The next pass reads this epoch (LitData counts epochs from 1).
  void set_epoch(int64_t epoch);
  /// The epoch of the current pass (before the first: the one it will read).
  int64_t epoch() const;
  /// Batches this rank yields in a whole pass of the current epoch.
  int64_t batches_per_pass() const;
  /// Batches taken in the current pass (skipped ones of a resumed pass included).
  int64_t batches_taken() const;
  /// Seconds the loop waited for a batch in the current pass (0 when reading keeps ahead).
  double wait_seconds() const;
  const StreamingLoaderOptions& options() const { return options_; }

  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

 private:
  friend class Fabric;
  /// fabric.setup_dataloaders (`call` names it in errors): the data split over `replicas` ranks,
  /// this one `rank` (the strategy's data dimension), and each batch moved to `device` (CUDA: read
  /// into pinned memory, copied without blocking). ValueError once a pass has begun, or when the
  /// options set world_size or rank to other values.
  void place(int replicas, int rank, c10::Device device, const std::string& call);
  std::shared_ptr<StreamingBatch> next_batch();
  void start_pass();
  /// An s3:// dataset: checks that the chunks the pass reads at once fit this process's share of
  /// the cache budget (ValueError naming the bytes), marks where each chunk is read for the last
  /// time, and starts the thread that downloads the next chunks (prefetch_chunks) before the loop
  /// reaches them.
  void plan_chunks();

  const StreamingDataset& dataset_;
  StreamingLoaderOptions options_;
  bool drop_last_ = false;
  std::optional<c10::Device> device_;  // set: batches are moved there (fabric.setup_dataloaders)
  std::unique_ptr<data_detail::LoaderPass> pass_;
  std::shared_ptr<StreamingDataLoader*> handle_;  // Fabric keeps a weak one: this loader, while it lives
};

}  // namespace lightning::fabric
