// Background saves in one process: the host copy they write from (checkpoint/background_write.h),
// fabric.save_in_background against fabric.save, and how its failures reach the caller. The
// multi-rank cases (kill -9, unwritable targets, training during the write) run from outside in
// tests/integration/background_save.sh.
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "lightning/fabric.h"
#include "lightning/fabric/checkpoint/background_write.h"
#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/utilities/process.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {
lf::Fabric cpu_fabric() { return lf::Fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({})); }

fs::path scratch(const std::string& name) {
  static const fs::path root = lf::make_temporary_directory("lf-background-save-test");
  return root / name;
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Trained {
  torch::nn::Linear net{torch::nn::Linear(16, 4)};
  torch::optim::Adam adam{net->parameters(), 0.1};
  void step() {
    adam.zero_grad();
    net(torch::ones({2, 16})).pow(2).mean().backward();
    adam.step();
  }
  lf::State state() { return {{"model", net}, {"optimizer", adam}, {"step", int64_t{7}}}; }
};
}  // namespace

TEST_CASE("host_copy shares nothing with the state, keeps shared storages shared, and saves the same bytes",
          "[checkpoint][background]") {
  const at::Tensor weight = torch::arange(12, torch::kFloat32).reshape({3, 4});
  const at::Tensor tied = weight.narrow(0, 1, 2);  // a view of the same storage, as tied weights are
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(weight);
  list.push_back(int64_t{3});
  lf::StateDict state = lf::make_state_dict();
  state.insert("weight", weight);
  state.insert("tied", tied);
  state.insert("list", list);
  state.insert("pair", c10::ivalue::Tuple::create({c10::IValue(weight.t()), c10::IValue("text")}));

  const lf::StateDict copy = lf::host_copy(state).toGenericDict();
  const at::Tensor copied = copy.at("weight").toTensor(), copied_tied = copy.at("tied").toTensor();
  CHECK(torch::equal(copied, weight));
  CHECK_FALSE(copied.storage().is_alias_of(weight.storage()));
  CHECK(copied_tied.storage().is_alias_of(copied.storage()));
  CHECK(copied_tied.storage_offset() == tied.storage_offset());
  CHECK(copy.at("list").toList().get(0).toTensor().is_same(copied));  // one tensor twice stays one
  CHECK(copy.at("pair").toTupleRef().elements()[0].toTensor().strides() == weight.t().strides());
  CHECK(lf::archive_bytes(copy) == lf::archive_bytes(state));

  weight.add_(100);  // training goes on: the copy keeps the values of the moment it was taken
  CHECK(copied.max().item<float>() == 11.0f);
  CHECK(copy.at("list").toList().get(0).toTensor().max().item<float>() == 11.0f);
}

TEST_CASE("save_in_background writes what fabric.save writes, as of the call", "[checkpoint][background]") {
  auto fabric = cpu_fabric();
  torch::manual_seed(3);
  Trained trained;
  trained.step();
  fabric.save(scratch("sync.ckpt"), trained.state());
  const at::Tensor at_save = trained.net->weight.detach().clone();
  fabric.save_in_background(scratch("background.ckpt"), trained.state());
  trained.step();  // changes the weights while the file may still be written
  fabric.wait_for_background_save();
  CHECK(file_bytes(scratch("background.ckpt")) == file_bytes(scratch("sync.ckpt")));

  torch::manual_seed(99);
  Trained restored;
  lf::State state = restored.state();
  fabric.load(scratch("background.ckpt"), state);
  CHECK(torch::equal(restored.net->weight, at_save));
  CHECK_FALSE(torch::equal(trained.net->weight, at_save));
  fabric.wait_for_background_save();  // nothing in flight: returns at once
}

TEST_CASE("a background save's failure names the path and the cause, once, at the next call",
          "[checkpoint][background]") {
  auto fabric = cpu_fabric();
  Trained trained;
  std::ofstream(scratch("a-file")) << "not a folder";
  const fs::path path = scratch("a-file") / "ck.pt";  // its folder cannot be created
  fabric.save_in_background(path, trained.state());
  CHECK_THROWS_WITH(fabric.wait_for_background_save(),
                    Contains("fabric.save_in_background(" + path.string() + ") failed on rank 0") &&
                        Contains("Cannot create the folder"));
  CHECK_NOTHROW(fabric.wait_for_background_save());  // reported once
  CHECK_FALSE(fs::exists(path));

  // The next save raises it too, before saving anew.
  fabric.save_in_background(path, trained.state());
  CHECK_THROWS_WITH(fabric.save(scratch("next.ckpt"), trained.state()), Contains("Cannot create the folder"));
  CHECK_FALSE(fs::exists(scratch("next.ckpt")));
  fabric.save(scratch("next.ckpt"), trained.state());
  CHECK(fs::exists(scratch("next.ckpt")));
}

TEST_CASE("the Fabric's destructor completes a background save in flight", "[checkpoint][background]") {
  torch::manual_seed(5);
  Trained trained;
  {
    auto fabric = cpu_fabric();
    fabric.save_in_background(scratch("at-exit.ckpt"), trained.state());
  }
  auto fabric = cpu_fabric();
  Trained restored;
  lf::State state = restored.state();
  fabric.load(scratch("at-exit.ckpt"), state);
  CHECK(torch::equal(restored.net->weight, trained.net->weight));
  CHECK(state.at("step").to<int64_t>() == 7);
}
