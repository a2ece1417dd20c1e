// setup_dataloaders' distributed forms, under lightning-run (ddp, 2 or 4 ranks):
//   lf_loader_checks
// For each form, over three epochs (the third chosen by set_epoch), every sample must be read
// exactly once per epoch across the ranks (counts all-reduced), and each rank's order must be
// the documented one:
//   - a dataset of 24 indices, without and with shuffling (shuffled orders differ per epoch;
//     set_epoch(1) repeats epoch 1's order);
//   - two datasets at once (a tuple), of 24 and 16 samples;
//   - your sampler (evens then odds, rotated by the epoch it gets through set_epoch), wrapped as
//     Python's DistributedSamplerWrapper: rank r takes positions r, r + W, ... of its order;
//     with shuffling, the positions are permuted, still once each;
//   - your sampler over 23 samples: padded by wrapping around to a multiple of W;
//   - a stream of 13 items (a StatefulDataset, rotated by its epoch): rank r reads items r, r + W,
//     ... of the stream, with no padding (counts differ by at most one); stacked (.map(Stack)),
//     each source batch is one item.
// Refusals: a shuffled stream; an unsized dataset that is not a stream.
//
// Exact resume (fabric.resume_state()), in two jobs:
//   lf_loader_checks resume-save PATH   a shuffled dataset of 48 (batches of 4) and a stream of 40
//                                       (batches of 3) stop after 3 and 2 batches; PATH holds the
//                                       loaders' positions and what every rank had read
//   lf_loader_checks resume-load PATH   the same loaders, loaded from PATH: the rest of the pass
//                                       and what was read before cover every sample once; under
//                                       the same world size each rank reads exactly the tail of
//                                       its uninterrupted pass; the next pass is the next epoch;
//                                       a stream every rank reads whole goes on where it was
// Each rank prints "FAIL: ..." per failed check and exits 1 if any failed.
#include <torch/torch.h>

#include <iostream>
#include <numeric>

#include "expect.h"
#include "lightning/fabric.h"

namespace lf = lightning::fabric;

namespace {
using checks::expect;
const auto refusal = [](auto&& fn) { return checks::refusal<lf::ValueError>(fn); };
using Batch = std::vector<torch::data::Example<>>;

struct Range : torch::data::datasets::Dataset<Range> {
  explicit Range(size_t n) : n(n), reported(n) {}
  torch::data::Example<> get(size_t index) override {
    return {torch::tensor({static_cast<int64_t>(index)}), torch::tensor({static_cast<int64_t>(index)})};
  }
  std::optional<size_t> size() const override { return reported; }
  size_t n;
  std::optional<size_t> reported;
};

// Evens then odds, rotated by 3 * epoch: the same list on every rank for an epoch.
struct EvenThenOdd : torch::data::samplers::Sampler<> {
  explicit EvenThenOdd(size_t n) : n(n) {}
  std::vector<size_t> order() const {
    std::vector<size_t> list;
    for (size_t i = 0; i < n; i += 2) list.push_back(i);
    for (size_t i = 1; i < n; i += 2) list.push_back(i);
    std::rotate(list.begin(), list.begin() + static_cast<std::ptrdiff_t>((3 * epoch) % n), list.end());
    return list;
  }
  void set_epoch(int64_t value) { epoch = static_cast<size_t>(value); }
  void reset(std::optional<size_t>) override { cursor = 0; }
  std::optional<std::vector<size_t>> next(size_t batch) override {
    const auto list = order();
    if (cursor >= list.size()) return std::nullopt;
    const size_t end = std::min(list.size(), cursor + batch);
    std::vector<size_t> out(list.begin() + static_cast<std::ptrdiff_t>(cursor), list.begin() + static_cast<std::ptrdiff_t>(end));
    cursor = end;
    return out;
  }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}
  size_t n, cursor = 0, epoch = 0;
};

// Items (i + 5 * epoch) mod n, i = 0..n-1, in batches of the requested size.
struct Stream : torch::data::datasets::StatefulDataset<Stream> {
  explicit Stream(int64_t n) : n(n) {}
  std::optional<Batch> get_batch(size_t size) override {
    if (next >= n) return std::nullopt;
    Batch batch;
    for (; next < n && batch.size() < size; ++next) {
      const int64_t item = (next + 5 * epoch) % n;
      batch.push_back({torch::tensor({item}), torch::tensor({item})});
    }
    return batch;
  }
  std::optional<size_t> size() const override { return std::nullopt; }
  void reset() override { next = 0; }
  void set_epoch(int64_t value) { epoch = value; }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}
  int64_t n, next = 0, epoch = 0;
};

template <class Loader>
std::vector<int64_t> read_epoch(Loader& loader) {
  std::vector<int64_t> seen;
  for (auto& batch : loader) {
    for (auto& example : batch) seen.push_back(example.data.template item<int64_t>());
  }
  return seen;
}

// Every index in [0, n) read once across the ranks.
bool once_each(lf::Fabric& fabric, const std::vector<int64_t>& seen, int64_t n) {
  auto counts = torch::zeros({n}, torch::kLong);
  for (int64_t index : seen) {
    if (index < 0 || index >= n) return false;
    counts[index] += 1;
  }
  counts = fabric.all_reduce(counts, lf::ReduceOp::Sum);
  return counts.eq(1).all().item<bool>();
}

// Rank r's positions r, r + W, ... of list padded (by wrapping) to a multiple of W.
std::vector<int64_t> strided(const std::vector<size_t>& list, int world, int rank) {
  std::vector<int64_t> out;
  const size_t total = (list.size() + world - 1) / world * world;
  for (size_t i = static_cast<size_t>(rank); i < total; i += static_cast<size_t>(world)) {
    out.push_back(static_cast<int64_t>(list[i % list.size()]));
  }
  return out;
}

std::string text(const std::vector<int64_t>& values) {
  std::string out;
  for (int64_t value : values) out += (out.empty() ? "" : " ") + std::to_string(value);
  return out;
}

void check_dataset(lf::Fabric& fabric, bool shuffle) {
  const std::string form = shuffle ? "a shuffled dataset" : "a dataset";
  auto loader = fabric.setup_dataloaders(Range(24), torch::data::DataLoaderOptions(5), lf::DataLoaderSettings{shuffle});
  std::vector<std::vector<int64_t>> epochs;
  for (int epoch = 0; epoch < 2; ++epoch) {
    epochs.push_back(read_epoch(loader));
    expect(once_each(fabric, epochs.back(), 24), form + ": every sample once in epoch " + std::to_string(epoch));
  }
  if (shuffle) {
    expect(epochs[0] != epochs[1], form + ": epochs 0 and 1 are shuffled differently");
  } else {
    std::vector<size_t> all(24);
    std::iota(all.begin(), all.end(), size_t{0});
    expect(epochs[0] == strided(all, fabric.world_size(), fabric.global_rank()), form + ": rank r reads r, r + W, ...");
  }
  loader.set_epoch(1);
  expect(read_epoch(loader) == epochs[1], form + ": set_epoch(1) repeats epoch 1's order");
}

void check_several(lf::Fabric& fabric) {
  auto [first, second] = fabric.setup_dataloaders(std::make_tuple(Range(24), Range(16)), torch::data::DataLoaderOptions(4));
  expect(first.size() == std::optional<size_t>((24 / fabric.world_size() + 3) / 4), "the first loader's batch count");
  expect(once_each(fabric, read_epoch(first), 24), "two datasets at once: the first, every sample once");
  expect(once_each(fabric, read_epoch(second), 16), "two datasets at once: the second, every sample once");
}

void check_sampler(lf::Fabric& fabric, bool shuffle) {
  const std::string form = shuffle ? "your sampler, shuffled" : "your sampler";
  auto loader = fabric.setup_dataloaders(Range(24), EvenThenOdd(24), torch::data::DataLoaderOptions(5),
                                         lf::DataLoaderSettings{shuffle});
  for (int64_t epoch : {0, 1}) {
    const auto seen = read_epoch(loader);
    expect(once_each(fabric, seen, 24), form + ": every sample once in epoch " + std::to_string(epoch));
    if (!shuffle) {
      EvenThenOdd reference(24);
      reference.set_epoch(epoch);
      const auto expected = strided(reference.order(), fabric.world_size(), fabric.global_rank());
      expect(seen == expected, form + ": epoch " + std::to_string(epoch) + " reads " + text(seen) + ", expected " + text(expected));
    }
  }
  loader.set_epoch(5);
  const auto seen = read_epoch(loader);
  expect(once_each(fabric, seen, 24), form + ": every sample once after set_epoch(5)");
  if (!shuffle) {
    EvenThenOdd reference(24);
    reference.set_epoch(5);
    expect(seen == strided(reference.order(), fabric.world_size(), fabric.global_rank()),
           form + ": set_epoch(5) reaches the sampler");
  }
}

void check_stream(lf::Fabric& fabric) {
  const int world = fabric.world_size(), rank = fabric.global_rank();
  constexpr int64_t n = 13;
  auto loader = fabric.setup_dataloaders(Stream(n), torch::data::DataLoaderOptions(3));
  expect(!loader.size().has_value(), "a stream has no batch count");
  for (int64_t epoch : {0, 1}) {
    const auto seen = read_epoch(loader);
    expect(once_each(fabric, seen, n), "a stream: every item once in epoch " + std::to_string(epoch));
    std::vector<int64_t> expected;
    for (int64_t i = rank; i < n; i += world) expected.push_back((i + 5 * epoch) % n);
    expect(seen == expected, "a stream, epoch " + std::to_string(epoch) + ": rank reads " + text(seen) + ", expected " + text(expected));
  }
  loader.set_epoch(4);
  const auto seen = read_epoch(loader);
  expect(!seen.empty() && seen.front() == (rank + 20) % n, "a stream: set_epoch(4) reaches the source");
  // Stacked: each source batch of 2 is one item, so rank r reads batches r, r + W, ...
  auto stacked = fabric.setup_dataloaders(Stream(n).map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(2));
  std::vector<int64_t> items;
  int64_t batches = 0;
  for (auto& batch : stacked) {
    for (int64_t i = 0; i < batch.data.size(0); ++i) items.push_back(batch.data[i].item<int64_t>());
    ++batches;
  }
  expect(once_each(fabric, items, n), "a stacked stream: every item once");
  const int64_t source_batches = (n + 1) / 2;
  expect(batches == (source_batches - rank + world - 1) / world, "a stacked stream: rank reads every W-th batch");
}

// A sampler whose list does not divide over the ranks: padded by wrapping around, as a dataset is.
void check_sampler_padding(lf::Fabric& fabric) {
  const int world = fabric.world_size();
  auto loader = fabric.setup_dataloaders(Range(23), EvenThenOdd(23), torch::data::DataLoaderOptions(4));
  const auto seen = read_epoch(loader);
  auto counts = torch::zeros({23}, torch::kLong);
  for (int64_t index : seen) counts[index] += 1;
  counts = fabric.all_reduce(counts, lf::ReduceOp::Sum);
  const int64_t padded = (23 + world - 1) / world * world;
  expect(counts.ge(1).all().item<bool>() && counts.sum().item<int64_t>() == padded,
         "your sampler over 23 samples: each at least once, " + std::to_string(padded) + " in all");
}

void check_refusals(lf::Fabric& fabric) {
  const auto shuffled = refusal([&] { fabric.setup_dataloaders(Stream(4), torch::data::DataLoaderOptions(2), lf::DataLoaderSettings{true}); });
  expect(shuffled.find("no indices to shuffle") != std::string::npos, "a shuffled stream is refused, got: " + shuffled);
  Range no_size(4);
  no_size.reported.reset();
  const auto message = refusal([&] { fabric.setup_dataloaders(no_size, torch::data::DataLoaderOptions(2)); });
  expect(message.find("StatefulDataset") != std::string::npos, "an unsized dataset that is not a stream is refused, got: " + message);
}

// Samples 0..47 shuffled (batches of 4) and a stream of 40 (batches of 3), in this order.
auto resume_loaders(lf::Fabric& fabric) {
  auto sampled = fabric.setup_dataloaders(Range(48), torch::data::DataLoaderOptions(4), lf::DataLoaderSettings{/*shuffle=*/true});
  auto streamed = fabric.setup_dataloaders(Stream(40), torch::data::DataLoaderOptions(3));  // set up second
  return std::make_pair(std::move(sampled), std::move(streamed));
}

// A stream every rank reads whole (use_distributed_sampler false): set up third.
auto whole_stream(lf::Fabric& fabric) {
  lf::DataLoaderSettings whole;
  whole.use_distributed_sampler = false;
  return fabric.setup_dataloaders(Stream(30), torch::data::DataLoaderOptions(3), whole);
}

template <class Loader>
std::vector<int64_t> take(Loader& loader, int batches) {
  std::vector<int64_t> seen;
  int taken = 0;
  for (auto& batch : loader) {
    for (auto& example : batch) seen.push_back(example.data.template item<int64_t>());
    if (++taken == batches) break;
  }
  return seen;
}

at::Tensor everyone(lf::Fabric& fabric, const std::vector<int64_t>& mine) {  // equal lengths on every rank
  return fabric.all_gather(torch::tensor(mine, torch::kLong)).flatten();
}

void resume_save(lf::Fabric& fabric, const std::string& path) {
  fabric.seed_everything(7);
  auto [sampled, streamed] = resume_loaders(fabric);
  auto whole = whole_stream(fabric);
  const auto read_sampled = everyone(fabric, take(sampled, 3));
  const auto read_streamed = everyone(fabric, take(streamed, 2));
  take(whole, 2);  // items 0..5 on every rank
  fabric.save(path, {{"resume", fabric.resume_state()}, {"read_sampled", read_sampled}, {"read_streamed", read_streamed}});
}

// Every index of [0, n) once in what was read before (held alike by every rank: counted on rank
// 0) and what every rank read after.
bool once_across(lf::Fabric& fabric, const at::Tensor& before, const std::vector<int64_t>& after, int64_t n) {
  auto counts = torch::zeros({n}, torch::kLong);
  if (fabric.global_rank() == 0) counts.index_add_(0, before, torch::ones_like(before));
  for (int64_t index : after) counts[index] += 1;
  counts = fabric.all_reduce(counts, lf::ReduceOp::Sum);
  return counts.eq(1).all().item<bool>();
}

void resume_load(lf::Fabric& fabric, const std::string& path) {
  fabric.seed_everything(7);
  auto [sampled, streamed] = resume_loaders(fabric);
  auto whole = whole_stream(fabric);
  lf::State state{{"resume", fabric.resume_state()}, {"read_sampled", torch::zeros({0})}, {"read_streamed", torch::zeros({0})}};
  fabric.load(path, state);
  const auto before_sampled = state.at("read_sampled").to<at::Tensor>();
  const auto before_streamed = state.at("read_streamed").to<at::Tensor>();
  const int world = fabric.world_size(), rank = fabric.global_rank();
  const bool same_world = before_sampled.numel() == 3 * 4 * world;  // saved by as many ranks
  const auto after_sampled = read_epoch(sampled);
  const auto after_streamed = read_epoch(streamed);
  std::vector<int64_t> rest_of_whole;
  for (int64_t item = 6; item < 30; ++item) rest_of_whole.push_back(item);
  expect(read_epoch(whole) == rest_of_whole, "a stream every rank reads whole goes on at item 6 on every rank");
  expect(once_across(fabric, before_sampled, after_sampled, 48),
         "resumed dataset: what was read before and the rest of the pass cover every sample once");
  expect(once_across(fabric, before_streamed, after_streamed, 40),
         "resumed stream: what was read before and the rest of the pass cover every item once");
  // The uninterrupted passes of this world size, from loaders of their own.
  auto [fresh_sampled, fresh_streamed] = resume_loaders(fabric);
  const auto whole_sampled = read_epoch(fresh_sampled), whole_streamed = read_epoch(fresh_streamed);
  if (same_world) {
    expect(std::vector<int64_t>(whole_sampled.begin() + 12, whole_sampled.end()) == after_sampled,
           "resumed dataset on rank " + std::to_string(rank) + ": reads " + text(after_sampled) +
               ", the uninterrupted pass's tail is " + text(std::vector<int64_t>(whole_sampled.begin() + 12, whole_sampled.end())));
    expect(std::vector<int64_t>(whole_streamed.begin() + 6, whole_streamed.end()) == after_streamed,
           "resumed stream on rank " + std::to_string(rank) + ": reads " + text(after_streamed));
  }
  expect(read_epoch(sampled) == read_epoch(fresh_sampled), "resumed dataset: the next pass is epoch 1, as uninterrupted");
  expect(read_epoch(streamed) == read_epoch(fresh_streamed), "resumed stream: the next pass is epoch 1, as uninterrupted");
}
}  // namespace

int main(int argc, char** argv) {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy("ddp"));
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc == 3 && (mode == "resume-save" || mode == "resume-load")) {
    mode == "resume-save" ? resume_save(fabric, argv[2]) : resume_load(fabric, argv[2]);
    if (checks::failures() > 0) return 1;
    std::cout << "rank " << fabric.global_rank() << " of " << fabric.world_size() << ": " << mode << " checks pass" << std::endl;
    return 0;
  }
  check_dataset(fabric, false);
  check_dataset(fabric, true);
  check_several(fabric);
  check_sampler(fabric, false);
  check_sampler(fabric, true);
  check_stream(fabric);
  check_sampler_padding(fabric);
  check_refusals(fabric);
  if (checks::failures() > 0) return 1;
  std::cout << "rank " << fabric.global_rank() << " of " << fabric.world_size() << ": loader checks pass" << std::endl;
  return 0;
}
