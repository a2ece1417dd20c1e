// The distributed sampler, Fabric::setup_dataloaders and seed_everything.
#include <torch/torch.h>

#include <set>

#include "lightning/fabric.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

namespace {
// Sample i is the scalar i (data) with target i % 3.
class RangeDataset : public torch::data::datasets::Dataset<RangeDataset> {
 public:
  explicit RangeDataset(size_t size) : size_(size) {}
  torch::data::Example<> get(size_t index) override {
    return {torch::full({1}, static_cast<double>(index)), torch::full({1}, static_cast<int64_t>(index % 3))};
  }
  torch::optional<size_t> size() const override { return size_; }

 private:
  size_t size_;
};

std::vector<size_t> epoch_of(lf::DistributedSampler& sampler) {
  sampler.reset();
  std::vector<size_t> all;
  while (auto batch = sampler.next(4)) all.insert(all.end(), batch->begin(), batch->end());
  return all;
}
}  // namespace

TEST_CASE("distributed sampler: ranks partition the data, padding by wrap-around", "[data]") {
  std::multiset<size_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    lf::DistributedSampler sampler(10, 3, rank, /*shuffle=*/false);
    CHECK(sampler.num_samples() == 4);
    for (size_t index : epoch_of(sampler)) seen.insert(index);
  }
  CHECK(seen.size() == 12);                       // 10 samples + 2 padding
  for (size_t i = 0; i < 10; ++i) CHECK(seen.count(i) >= 1);
  CHECK(seen.count(0) == 2);                      // padding repeats from the start
  CHECK(seen.count(1) == 2);
  lf::DistributedSampler dropping(10, 3, 0, false, 0, /*drop_last=*/true);
  CHECK(dropping.num_samples() == 3);
  CHECK(epoch_of(dropping) == std::vector<size_t>{0, 3, 6});
}

TEST_CASE("distributed sampler: shuffled identically on every rank, differently each epoch", "[data]") {
  lf::DistributedSampler rank0(100, 2, 0, true, /*seed=*/42);
  lf::DistributedSampler rank1(100, 2, 1, true, 42);
  auto first0 = epoch_of(rank0);
  auto first1 = epoch_of(rank1);
  std::set<size_t> together(first0.begin(), first0.end());
  together.insert(first1.begin(), first1.end());
  CHECK(together.size() == 100);                  // disjoint halves of one permutation
  CHECK(rank0.epoch() == 0);
  auto second0 = epoch_of(rank0);
  CHECK(rank0.epoch() == 1);
  CHECK(second0 != first0);
  lf::DistributedSampler again(100, 2, 0, true, 42);
  CHECK(epoch_of(again) == first0);               // deterministic per (seed, epoch)
  CHECK_THROWS_WITH(lf::DistributedSampler(10, 2, 2), Contains("rank=2"));
}

TEST_CASE("distributed sampler: set_epoch(k) gives the order of epoch k of an uninterrupted run", "[data]") {
  lf::DistributedSampler straight(50, 2, 1, true, /*seed=*/7);
  std::vector<std::vector<size_t>> epochs;
  for (int epoch = 0; epoch < 4; ++epoch) epochs.push_back(epoch_of(straight));
  lf::DistributedSampler resumed(50, 2, 1, true, 7);
  resumed.set_epoch(2);
  CHECK(epoch_of(resumed) == epochs[2]);
  CHECK(resumed.epoch() == 2);
  CHECK(epoch_of(resumed) == epochs[3]);  // and counts on from there
  lf::DistributedSampler back(50, 2, 1, true, 7);
  for (int epoch = 0; epoch < 3; ++epoch) epoch_of(back);
  back.set_epoch(1);  // backwards too
  CHECK(epoch_of(back) == epochs[1]);
}

TEST_CASE("FabricDataLoader::set_epoch reaches the sampler inside the loader", "[data]") {
  auto orders = [](std::optional<int64_t> start_epoch, int passes) {
    lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({}));
    auto loader = fabric.setup_dataloaders(RangeDataset(12).map(torch::data::transforms::Stack<>()),
                                           torch::data::DataLoaderOptions(4), lf::DataLoaderSettings{true});
    if (start_epoch) loader.set_epoch(*start_epoch);
    std::vector<std::vector<double>> result;
    for (int pass = 0; pass < passes; ++pass) {
      std::vector<double> order;
      for (auto& batch : loader) {
        for (int64_t i = 0; i < batch.data.size(0); ++i) order.push_back(batch.data[i].item<double>());
      }
      result.push_back(order);
    }
    return result;
  };
  const auto straight = orders(std::nullopt, 3);
  REQUIRE(straight[0] != straight[2]);
  CHECK(orders(2, 1)[0] == straight[2]);
  CHECK(orders(1, 2) == std::vector<std::vector<double>>{straight[1], straight[2]});
}

TEST_CASE("setup_dataloaders yields stacked batches on the device, every sample once", "[data]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({}));
  auto loader = fabric.setup_dataloaders(RangeDataset(10).map(torch::data::transforms::Stack<>()),
                                         torch::data::DataLoaderOptions(4), lf::DataLoaderSettings{true});
  CHECK(loader.size().value() == 3);
  std::vector<std::set<double>> epochs;
  std::vector<std::vector<double>> orders;
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<double> values;
    std::vector<double> order;
    for (auto& batch : loader) {
      CHECK(batch.data.device() == fabric.device());
      for (int64_t i = 0; i < batch.data.size(0); ++i) {
        values.insert(batch.data[i].item<double>());
        order.push_back(batch.data[i].item<double>());
      }
    }
    epochs.push_back(values);
    orders.push_back(order);
  }
  CHECK(epochs[0].size() == 10);
  CHECK(epochs[0] == epochs[1]);
  CHECK(orders[0] != orders[1]);  // reshuffled per epoch
}

TEST_CASE("setup_dataloaders on rank 1 of 2 reads its half, a ready-made loader is refused", "[data][errors]") {
  std::map<std::string, std::string> torchrun{{"TORCHELASTIC_RUN_ID", "t"}, {"RANK", "1"}, {"GROUP_RANK", "1"},
                                              {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}, {"WORLD_SIZE", "2"},
                                              {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}};
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy("ddp"), lf::env::map_env(torchrun));  // no group: nothing here communicates
  CHECK(fabric.world_size() == 2);
  CHECK(fabric.global_rank() == 1);
  auto loader = fabric.setup_dataloaders(RangeDataset(10).map(torch::data::transforms::Stack<>()),
                                         torch::data::DataLoaderOptions(2));
  std::vector<double> values;
  for (auto& batch : loader) {
    for (int64_t i = 0; i < batch.data.size(0); ++i) values.push_back(batch.data[i].item<double>());
  }
  CHECK(values == std::vector<double>{1, 3, 5, 7, 9});
  auto ready = torch::data::make_data_loader(RangeDataset(10).map(torch::data::transforms::Stack<>()), 2);
  CHECK_THROWS_WITH(fabric.setup_dataloaders(std::move(ready)), Contains("2 processes") && Contains("use_distributed_sampler=false"));
  auto own = torch::data::make_data_loader(RangeDataset(4).map(torch::data::transforms::Stack<>()), 2);
  auto wrapped = fabric.setup_dataloaders(std::move(own), lf::DataLoaderSettings{false, false});
  size_t batches = 0;
  for (auto& batch : wrapped) batches += batch.data.size(0) > 0 ? 1 : 0;
  CHECK(batches == 2);
}

TEST_CASE("seed_everything seeds workers by default from Fabric, not from the free function, as Python",
          "[seed]") {
  lf::Fabric::seed_everything(5);
  CHECK(std::string(std::getenv("PL_SEED_WORKERS")) == "1");
  lf::seed_everything(5);
  CHECK(std::string(std::getenv("PL_SEED_WORKERS")) == "0");
}

TEST_CASE("seed_everything refuses a seed outside numpy's uint32 bounds, as Python", "[seed][errors]") {
  CHECK(lf::seed_everything(4294967295ULL) == 4294967295ULL);  // 2**32 - 1, the largest
  // Python's seed_everything(10e9) raises ValueError; 10e9 converts to the same whole number here.
  CHECK_THROWS_AS(lf::seed_everything(static_cast<uint64_t>(10e9)), lf::ValueError);
  CHECK_THROWS_WITH(lf::seed_everything(static_cast<uint64_t>(10e9)),
                    Contains("10000000000 is not in bounds, numpy accepts from 0 to 4294967295"));
  CHECK_THROWS_WITH(lf::Fabric::seed_everything(4294967296ULL), Contains("4294967296 is not in bounds"));
  // A negative int converted to uint64_t wraps far above the bounds: refused as well.
  CHECK_THROWS_AS(lf::seed_everything(static_cast<uint64_t>(-1)), lf::ValueError);
  CHECK(std::string(std::getenv("PL_GLOBAL_SEED")) == "4294967295");  // a refused seed changes nothing
  setenv("PL_GLOBAL_SEED", "4294967296", 1);
  CHECK_THROWS_WITH(lf::seed_everything(), Contains("4294967296 is not in bounds") && Contains("PL_GLOBAL_SEED"));
  lf::seed_everything(5);  // a valid recorded seed for what runs next
}
