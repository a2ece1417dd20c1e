#include "lightning/fabric/data/litdata_order.h"

#include <algorithm>
#include <numeric>

namespace lightning::fabric::data_detail {

NumpyRandomState::NumpyRandomState(const std::vector<uint32_t>& key) {
  // MT19937 init_genrand(19650218), then init_by_array(key), as numpy's legacy seeding of a list.
  state_[0] = 19650218u;
  for (uint32_t i = 1; i < 624; ++i) state_[i] = 1812433253u * (state_[i - 1] ^ (state_[i - 1] >> 30)) + i;
  uint32_t i = 1, j = 0;
  const uint32_t length = static_cast<uint32_t>(key.size());
  for (uint32_t k = std::max<uint32_t>(624, length); k > 0; --k) {
    state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1664525u)) + key[j] + j;
    ++i;
    ++j;
    if (i >= 624) {
      state_[0] = state_[623];
      i = 1;
    }
    if (j >= length) j = 0;
  }
  for (uint32_t k = 623; k > 0; --k) {
    state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1566083941u)) - i;
    ++i;
    if (i >= 624) {
      state_[0] = state_[623];
      i = 1;
    }
  }
  state_[0] = 0x80000000u;
}

uint32_t NumpyRandomState::next_uint32() {
  if (position_ >= 624) {
    for (int k = 0; k < 624; ++k) {
      uint32_t y = (state_[k] & 0x80000000u) | (state_[(k + 1) % 624] & 0x7fffffffu);
      state_[k] = state_[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    position_ = 0;
  }
  uint32_t y = state_[position_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t NumpyRandomState::interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  for (int shift : {1, 2, 4, 8, 16, 32}) mask |= mask >> shift;
  if (max <= 0xffffffffu) {
    uint64_t value;
    do value = next_uint32() & mask;
    while (value > max);
    return value;
  }
  uint64_t value;
  do value = ((static_cast<uint64_t>(next_uint32()) << 32) | next_uint32()) & mask;
  while (value > max);
  return value;
}

namespace {

// LitData's _associate_chunks_and_intervals_to_workers: item quotas per global worker (whole
// batches, the remainder to one worker of the last rank unless drop_last), then the pieces in
// visiting order, a chunk split across consecutive workers where a quota ends inside it.
std::vector<std::vector<ChunkPiece>> associate(std::vector<ChunkPiece> pieces, const OrderSpec& spec) {
  int64_t num_items = 0;
  for (const auto& piece : pieces) num_items += piece.size();
  const int64_t batch = spec.batch_size;
  const int64_t max_batches = num_items / batch;
  const int workers = spec.num_workers;
  std::vector<int64_t> quota;
  for (int rank = 0; rank < spec.world_size; ++rank) {
    const int64_t per_rank = max_batches / spec.world_size;
    const int64_t base = per_rank / workers, rem = per_rank % workers;
    std::vector<int64_t> own(workers);
    for (int w = 0; w < workers; ++w) own[w] = base + (w < rem ? 1 : 0);
    if (rank == spec.world_size - 1) {
      const int64_t assigned =
          batch * (std::accumulate(quota.begin(), quota.end(), int64_t{0}) + std::accumulate(own.begin(), own.end(), int64_t{0}));
      if (batch > 1) {
        for (auto& q : own) q *= batch;
        for (auto& q : quota) q *= batch;
      }
      const int64_t left = num_items - assigned;
      if (!spec.drop_last && left > 0) own[rem % workers] += left;
    }
    quota.insert(quota.end(), own.begin(), own.end());
  }
  std::vector<std::vector<ChunkPiece>> assigned(quota.size());
  for (ChunkPiece piece : pieces) {
    size_t worker = 0;
    while (worker < quota.size()) {
      if (quota[worker] == 0) {
        ++worker;
        continue;
      }
      const int64_t in_chunk = piece.size();
      if (in_chunk == 0) break;
      if (in_chunk > quota[worker]) {
        ChunkPiece part = piece;
        part.roi_end = piece.roi_start + quota[worker];
        assigned[worker].push_back(part);
        piece.roi_start += quota[worker];
        quota[worker] = 0;
        ++worker;
      } else {
        assigned[worker].push_back(piece);
        quota[worker] -= in_chunk;
        break;
      }
    }
  }
  return assigned;
}

}  // namespace

std::vector<std::vector<ChunkPiece>> assign_pieces(const std::vector<int64_t>& chunk_sizes, const OrderSpec& spec) {
  std::vector<ChunkPiece> pieces;
  int64_t start = 0;
  for (size_t c = 0; c < chunk_sizes.size(); ++c) {
    pieces.push_back({static_cast<int64_t>(c), start, start, start + chunk_sizes[c], start + chunk_sizes[c]});
    start += chunk_sizes[c];
  }
  if (spec.shuffle) {  // FullShuffle: the chunks permuted by RandomState([seed, epoch])
    std::vector<int64_t> order(pieces.size());
    std::iota(order.begin(), order.end(), 0);
    NumpyRandomState rng({spec.seed, static_cast<uint32_t>(spec.epoch)});
    rng.shuffle(order);
    std::vector<ChunkPiece> shuffled;
    shuffled.reserve(pieces.size());
    for (int64_t c : order) shuffled.push_back(pieces[c]);
    pieces = std::move(shuffled);
  }
  return associate(std::move(pieces), spec);
}

std::vector<int64_t> piece_items(const ChunkPiece& piece, int64_t num_chunks, const OrderSpec& spec) {
  std::vector<int64_t> items(piece.size());
  std::iota(items.begin(), items.end(), piece.roi_start);
  if (!spec.shuffle || items.size() < 2) return items;
  // _block_shuffle: aligned blocks of item_window shuffled each, then the block order shuffled.
  NumpyRandomState rng({spec.seed, static_cast<uint32_t>(num_chunks), static_cast<uint32_t>(spec.epoch),
                        static_cast<uint32_t>(piece.chunk)});
  if (spec.item_window <= 1) {
    rng.shuffle(items);
    return items;
  }
  std::vector<std::vector<int64_t>> blocks;
  for (size_t begin = 0; begin < items.size(); begin += spec.item_window) {
    const size_t end = std::min(items.size(), begin + static_cast<size_t>(spec.item_window));
    blocks.emplace_back(items.begin() + begin, items.begin() + end);
    rng.shuffle(blocks.back());
  }
  if (blocks.size() > 1) rng.shuffle(blocks);
  items.clear();
  for (const auto& block : blocks) items.insert(items.end(), block.begin(), block.end());
  return items;
}

std::vector<std::vector<int64_t>> rank_batches(const std::vector<int64_t>& chunk_sizes, const OrderSpec& spec, int rank) {
  const auto pieces = assign_pieces(chunk_sizes, spec);
  const int64_t num_chunks = static_cast<int64_t>(chunk_sizes.size());
  std::vector<std::vector<std::vector<int64_t>>> per_worker(spec.num_workers);
  for (int w = 0; w < spec.num_workers; ++w) {
    std::vector<int64_t> stream;
    for (const auto& piece : pieces[static_cast<size_t>(rank) * spec.num_workers + w]) {
      const auto items = piece_items(piece, num_chunks, spec);
      stream.insert(stream.end(), items.begin(), items.end());
    }
    for (size_t begin = 0; begin < stream.size(); begin += spec.batch_size) {
      const size_t end = std::min(stream.size(), begin + static_cast<size_t>(spec.batch_size));
      per_worker[w].emplace_back(stream.begin() + begin, stream.begin() + end);
    }
  }
  std::vector<std::vector<int64_t>> batches;
  std::vector<size_t> next(spec.num_workers, 0);
  for (bool any = true; any;) {
    any = false;
    for (int w = 0; w < spec.num_workers; ++w) {
      if (next[w] < per_worker[w].size()) {
        batches.push_back(std::move(per_worker[w][next[w]++]));
        any = true;
      }
    }
  }
  return batches;
}

}  // namespace lightning::fabric::data_detail
