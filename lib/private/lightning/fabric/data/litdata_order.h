// The order in which LitData's StreamingDataset serves a dataset's items: which chunk pieces each
// (rank, worker) reads in an epoch and in what order it reads the items of each piece, computed as
// litdata 0.2.76 does with NumPy's legacy RandomState, so that a C++ job reads the same samples in
// the same order as a Python job of the same topology (docs/data.md, "Loading: the order").
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace lightning::fabric::data_detail {

/// numpy.random.RandomState(key) for a list key: MT19937 seeded by init_by_array, with the legacy
/// bounded draws that shuffle, permutation and randint use.
class NumpyRandomState {
 public:
  explicit NumpyRandomState(const std::vector<uint32_t>& key);
  uint32_t next_uint32();
  /// Uniform in [0, max] by masked rejection (numpy's random_interval).
  uint64_t interval(uint64_t max);
  /// In place, as RandomState.shuffle of a list: Fisher-Yates from the back.
  template <class T>
  void shuffle(std::vector<T>& values) {
    for (size_t i = values.size(); i > 1; --i) {
      size_t j = static_cast<size_t>(interval(i - 1));
      std::swap(values[i - 1], values[j]);
    }
  }

 private:
  uint32_t state_[624];
  int position_ = 624;
};

/// Global items [roi_start, roi_end) of a chunk whose items are [chunk_start, chunk_end).
struct ChunkPiece {
  int64_t chunk = 0;
  int64_t chunk_start = 0, roi_start = 0, roi_end = 0, chunk_end = 0;
  int64_t size() const { return roi_end - roi_start; }
};

/// What the order depends on. num_workers and batch_size are the loader's (LitData's DataLoader
/// workers, at least 1); epoch counts from 1.
struct OrderSpec {
  bool shuffle = false;
  uint32_t seed = 42;
  bool drop_last = false;
  int64_t item_window = 256;
  int world_size = 1;
  int num_workers = 1;
  int64_t batch_size = 1;
  int64_t epoch = 1;
};

/// The pieces every global worker (rank * num_workers + worker) reads, in reading order.
std::vector<std::vector<ChunkPiece>> assign_pieces(const std::vector<int64_t>& chunk_sizes, const OrderSpec& spec);

/// The items of one piece in the order its worker reads them.
std::vector<int64_t> piece_items(const ChunkPiece& piece, int64_t num_chunks, const OrderSpec& spec);

/// The batches a rank yields in one epoch, in order: each of its workers cuts its item stream into
/// batches of batch_size (the last one may be short), and the loader takes one batch from each
/// worker in turn, skipping workers that are done (PyTorch's DataLoader over an IterableDataset).
std::vector<std::vector<int64_t>> rank_batches(const std::vector<int64_t>& chunk_sizes, const OrderSpec& spec, int rank);

}  // namespace lightning::fabric::data_detail
