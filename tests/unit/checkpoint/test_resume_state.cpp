// Exact resume in one process (fabric.resume_state()): a loader and the generators continue after
// fabric.load as the run that was never stopped did, and the refusals name the fix.
#include <torch/torch.h>

#include <filesystem>

#include "lightning/fabric.h"
#include "lightning/fabric/utilities/process.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {
// Sample i is the scalar i.
class Indices : public torch::data::datasets::Dataset<Indices> {
 public:
  explicit Indices(size_t size) : size_(size) {}
  torch::data::Example<> get(size_t index) override {
    return {torch::full({1}, static_cast<int64_t>(index)), torch::zeros({1})};
  }
  torch::optional<size_t> size() const override { return size_; }

 private:
  size_t size_;
};

using Batch = std::vector<torch::data::Example<>>;

// Items 0..n-1 (shifted by 7 per epoch), in batches of the requested size: a stream.
struct Counting : torch::data::datasets::StatefulDataset<Counting> {
  explicit Counting(int64_t n) : n(n) {}
  std::optional<Batch> get_batch(size_t size) override {
    if (next >= n) return std::nullopt;
    Batch batch;
    for (; next < n && batch.size() < size; ++next) batch.push_back({torch::tensor({(next + 7 * epoch) % n}), torch::zeros({1})});
    return batch;
  }
  std::optional<size_t> size() const override { return std::nullopt; }
  void reset() override { next = 0; }
  void set_epoch(int64_t value) { epoch = value; }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}
  int64_t n, next = 0, epoch = 0;
};

lf::Fabric cpu_fabric() { return lf::Fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({})); }

fs::path scratch(const std::string& name) {
  static const fs::path root = lf::make_temporary_directory("lf-resume-test");
  return root / name;
}

// What a loop sees per batch: the batch's first sample, then a draw from the CPU generator.
template <class Batch>
std::vector<double> look(const Batch& batch) {
  if constexpr (std::is_same_v<Batch, torch::data::Example<>>) {
    return {batch.data[0][0].template item<double>(), torch::rand({1}).item<double>()};
  } else {
    return {batch.front().data[0].template item<double>(), torch::rand({1}).item<double>()};
  }
}

// Runs `passes` passes; after `save_after` batches of the first, saves to path (with the resume
// entry). Returns what every batch after that save looked like.
template <class Make>
std::vector<std::vector<double>> straight_run(Make make, const fs::path& path, int save_after, int passes) {
  auto fabric = cpu_fabric();
  fabric.seed_everything(3);
  auto loader = make(fabric);
  lf::State state{{"resume", fabric.resume_state()}};
  std::vector<std::vector<double>> after_save;
  int taken = 0;
  for (int pass = 0; pass < passes; ++pass) {
    for (auto& batch : loader) {
      const auto seen = look(batch);
      if (taken++ >= save_after) after_save.push_back(seen);
      if (taken == save_after) fabric.save(path, state);
    }
  }
  return after_save;
}

template <class Make>
std::vector<std::vector<double>> resumed_run(Make make, const fs::path& path, int passes) {
  auto fabric = cpu_fabric();
  fabric.seed_everything(3);  // the sampler's shuffle seed, as in the straight run
  auto loader = make(fabric);
  torch::manual_seed(99);  // the generator must come from the checkpoint
  lf::State state{{"resume", fabric.resume_state()}};
  fabric.load(path, state);
  std::vector<std::vector<double>> seen;
  for (int pass = 0; pass < passes; ++pass) {
    for (auto& batch : loader) seen.push_back(look(batch));
  }
  return seen;
}
}  // namespace

TEST_CASE("exact resume: a shuffled loader and the CPU generator go on as the run never stopped", "[resume]") {
  auto make = [](lf::Fabric& fabric) {
    return fabric.setup_dataloaders(Indices(22), torch::data::DataLoaderOptions(4), lf::DataLoaderSettings{/*shuffle=*/true});
  };
  const auto path = scratch("sampler.ckpt");
  const auto expected = straight_run(make, path, /*save_after=*/3, /*passes=*/3);
  const auto resumed = resumed_run(make, path, /*passes=*/3);  // the rest of pass 0, then passes 1 and 2
  REQUIRE(expected.size() == 6 * 3 - 3);
  CHECK(resumed == expected);
}

TEST_CASE("exact resume: a stream skips what it handed out and goes on in the same epoch", "[resume]") {
  auto make = [](lf::Fabric& fabric) { return fabric.setup_dataloaders(Counting(17), torch::data::DataLoaderOptions(3)); };
  const auto path = scratch("stream.ckpt");
  const auto expected = straight_run(make, path, /*save_after=*/4, /*passes=*/2);
  const auto resumed = resumed_run(make, path, /*passes=*/2);
  REQUIRE(expected.size() == 6 * 2 - 4);
  CHECK(resumed == expected);
}

TEST_CASE("exact resume: saved after a pass ended, the next pass is the next epoch from its start", "[resume]") {
  auto make = [](lf::Fabric& fabric) {
    return fabric.setup_dataloaders(Indices(12), torch::data::DataLoaderOptions(4), lf::DataLoaderSettings{true});
  };
  const auto path = scratch("pass-end.ckpt");
  std::vector<std::vector<double>> expected, resumed;
  {
    auto fabric = cpu_fabric();
    fabric.seed_everything(3);
    auto loader = make(fabric);
    for (auto& batch : loader) (void)batch;
    fabric.save(path, {{"resume", fabric.resume_state()}});
    for (auto& batch : loader) expected.push_back(look(batch));
  }
  auto fabric = cpu_fabric();
  fabric.seed_everything(3);
  auto loader = make(fabric);
  lf::State state{{"resume", fabric.resume_state()}};
  fabric.load(path, state);
  for (auto& batch : loader) resumed.push_back(look(batch));
  REQUIRE(expected.size() == 3);
  CHECK(resumed == expected);
}

TEST_CASE("exact resume: saved again in a resumed pass, and saved before the resumed pass began", "[resume]") {
  auto make = [](lf::Fabric& fabric) {
    return fabric.setup_dataloaders(Indices(40), torch::data::DataLoaderOptions(4), lf::DataLoaderSettings{true});
  };
  const auto first = scratch("first.ckpt"), second = scratch("second.ckpt"), untouched = scratch("untouched.ckpt");
  const auto expected = straight_run(make, first, /*save_after=*/2, /*passes=*/2);  // 18 batches after the save
  {  // resumed at batch 2, saved again after 3 more (batch 5 of the pass), and at once after a load
    auto fabric = cpu_fabric();
    fabric.seed_everything(3);
    auto loader = make(fabric);
    lf::State state{{"resume", fabric.resume_state()}};
    fabric.load(first, state);
    int taken = 0;
    for (auto& batch : loader) {
      (void)look(batch);
      if (++taken == 3) {
        fabric.save(second, state);
        break;
      }
    }
    auto again = cpu_fabric();
    again.seed_everything(3);
    auto other = make(again);
    lf::State reloaded{{"resume", again.resume_state()}};
    again.load(first, reloaded);
    again.save(untouched, reloaded);  // no pass began since the load: the file keeps batch 2
  }
  const auto from_second = resumed_run(make, second, /*passes=*/2);
  CHECK(from_second == std::vector<std::vector<double>>(expected.begin() + 3, expected.end()));
  CHECK(resumed_run(make, untouched, /*passes=*/2) == expected);
}

TEST_CASE("exact resume: the refusals name the checkpoint, the entry and the fix", "[resume][errors]") {
  auto fabric = cpu_fabric();
  const auto plain = scratch("plain.ckpt");
  fabric.save(plain, {{"step", 3}});
  lf::State state{{"resume", fabric.resume_state()}, {"step", int64_t{0}}};
  CHECK_THROWS_WITH(fabric.load(plain, state), Contains("has no 'resume' entry") && Contains("strict=false"));
  fabric.load(plain, state, /*strict=*/false);  // inexact: a warning
  CHECK(state.at("step").to<int64_t>() == 3);

  const auto with_loader = scratch("one-loader.ckpt");
  {
    auto saver = cpu_fabric();
    auto loader = saver.setup_dataloaders(Indices(8), torch::data::DataLoaderOptions(2));
    for (auto& batch : loader) (void)batch;
    saver.save(with_loader, {{"resume", saver.resume_state()}});
  }
  lf::State resume_only{{"resume", fabric.resume_state()}};
  CHECK_THROWS_WITH(fabric.load(with_loader, resume_only),
                    Contains("holds the positions of 1 loader(s), and this Fabric has set up 0") &&
                        Contains("before fabric.load"));

  const auto wrong_value = scratch("wrong-value.ckpt");
  fabric.save(wrong_value, {{"resume", 5}});
  CHECK_THROWS_WITH(fabric.load(wrong_value, resume_only), Contains("not what fabric.resume_state() saves"));

  auto other = cpu_fabric();
  CHECK_THROWS_WITH(fabric.save(scratch("x.ckpt"), {{"resume", other.resume_state()}}),
                    Contains("resume_state() of another Fabric"));
  CHECK_THROWS_WITH(fabric.resume_state()->state_dict(), Contains("saved by fabric.save"));
  CHECK_FALSE(fs::exists(scratch("x.ckpt")));
}
