// fabric.save / load / load_raw in one process: every state kind round-trips, strict and
// non-strict loading, filters, the remainder, and the errors for bad files.
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "lightning/fabric.h"
#include "lightning/fabric/utilities/process.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {
struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(6, 8))), norm(register_module("norm", torch::nn::BatchNorm1d(8))),
              fc2(register_module("fc2", torch::nn::Linear(8, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(norm(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

lf::Fabric cpu_fabric() { return lf::Fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({})); }

fs::path scratch(const std::string& name) {
  static const fs::path root = lf::make_temporary_directory("lf-checkpoint-test");
  return root / name;
}

template <class Optimizer>
void train(Net& net, Optimizer& optimizer, int steps, int seed) {
  torch::manual_seed(seed);
  for (int i = 0; i < steps; ++i) {
    const auto x = torch::randn({5, 6});
    optimizer.step([&] {  // a closure, so LBFGS trains too
      optimizer.zero_grad();
      auto loss = net(x).pow(2).mean();
      loss.backward();
      return loss;
    });
  }
}

bool same_parameters(const Net& a, const Net& b) {
  for (size_t i = 0; i < a->parameters().size(); ++i) {
    if (!torch::equal(a->parameters()[i], b->parameters()[i])) return false;
  }
  return torch::equal(a->norm->running_mean, b->norm->running_mean);
}

// Train, save, restore into fresh objects, train both on: the continuation is bitwise identical
// only if the optimizer's state came back whole.
template <class Optimizer, class Options>
void check_optimizer_round_trip(const std::string& name, Options options) {
  auto fabric = cpu_fabric();
  torch::manual_seed(1);
  Net net;
  Optimizer optimizer(net->parameters(), options);
  train(net, optimizer, 3, 2);
  const fs::path path = scratch(name + ".ckpt");
  fabric.save(path, {{"model", net}, {"optimizer", optimizer}});

  torch::manual_seed(99);
  Net restored;
  Optimizer restored_optimizer(restored->parameters(), Options(options).lr(123.0));
  lf::State state{{"model", restored}, {"optimizer", restored_optimizer}};
  fabric.load(path, state);
  CHECK(same_parameters(net, restored));
  train(net, optimizer, 2, 3);
  train(restored, restored_optimizer, 2, 3);
  INFO(name);
  CHECK(same_parameters(net, restored));
}
}  // namespace

TEST_CASE("save/load round-trips every optimizer's state bitwise", "[checkpoint]") {
  check_optimizer_round_trip<torch::optim::SGD>("sgd", torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
  check_optimizer_round_trip<torch::optim::Adam>("adam", torch::optim::AdamOptions(0.01).amsgrad(true));
  check_optimizer_round_trip<torch::optim::AdamW>("adamw", torch::optim::AdamWOptions(0.01));
  check_optimizer_round_trip<torch::optim::RMSprop>("rmsprop", torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
  check_optimizer_round_trip<torch::optim::Adagrad>("adagrad", torch::optim::AdagradOptions(0.1));
}

TEST_CASE("other optimizers go through LibTorch's archive", "[checkpoint]") {
  auto fabric = cpu_fabric();
  Net net;
  torch::optim::LBFGS lbfgs(net->parameters(), torch::optim::LBFGSOptions(0.1));
  fabric.save(scratch("lbfgs.ckpt"), {{"optimizer", lbfgs}});
  CHECK(fabric.load(scratch("lbfgs.ckpt")).at("optimizer").toGenericDict().contains("libtorch_archive"));
  Net other;
  torch::optim::LBFGS restored(other->parameters(), torch::optim::LBFGSOptions(0.1));
  lf::State state{{"optimizer", restored}};
  CHECK_NOTHROW(fabric.load(scratch("lbfgs.ckpt"), state));
  torch::optim::SGD sgd(other->parameters(), 0.1);
  lf::State wrong{{"optimizer", sgd}};
  CHECK_THROWS_WITH(fabric.load(scratch("lbfgs.ckpt"), wrong), Contains("different kind of optimizer"));
}

TEST_CASE("save/load round-trips plain values, nested states, schedulers and the loss scaler", "[checkpoint]") {
  auto fabric = cpu_fabric();
  Net net;
  torch::optim::SGD sgd(net->parameters(), 1.0);
  torch::optim::StepLR scheduler(sgd, /*step_size=*/2, /*gamma=*/0.5);
  for (int i = 0; i < 3; ++i) scheduler.step();  // lr 1 -> 0.5 after 2 steps
  auto scaler = std::make_shared<lf::LossScaler>();
  c10::List<int64_t> list({1, 2, 3});
  const fs::path path = scratch("values.ckpt");
  fabric.save(path, {{"scheduler", scheduler}, {"optimizer", sgd}, {"scaler", scaler}, {"step", 42},
                     {"loss", 0.25}, {"done", true}, {"name", std::string("run-7")}, {"tensor", torch::arange(4)},
                     {"list", list}, {"nested", lf::State{{"epoch", 3}, {"model", net}}}});

  Net other;
  torch::optim::SGD other_sgd(other->parameters(), 1.0);
  torch::optim::StepLR other_scheduler(other_sgd, 2, 0.5);
  auto other_scaler = std::make_shared<lf::LossScaler>(lf::LossScalerOptions{8.0, 2.0, 0.5, 10});
  lf::State state{{"scheduler", other_scheduler}, {"optimizer", other_sgd}, {"scaler", other_scaler}, {"step", 0},
                  {"loss", 0.0}, {"done", false}, {"name", std::string()}, {"tensor", torch::zeros(1)},
                  {"list", c10::List<int64_t>()}, {"nested", lf::State{{"epoch", 0}, {"model", other}}}};
  auto remainder = fabric.load(path, state);
  CHECK(remainder.size() == 0);
  CHECK(state.at("step").to<int64_t>() == 42);
  CHECK(state.at("loss").to<double>() == 0.25);
  CHECK(state.at("done").to<bool>());
  CHECK(state.at("name").to<std::string>() == "run-7");
  CHECK(torch::equal(state.at("tensor").value().toTensor(), torch::arange(4)));
  CHECK(state.at("list").value().toIntVector() == std::vector<int64_t>{1, 2, 3});
  CHECK(state.at("nested").nested().at("epoch").to<int64_t>() == 3);
  CHECK(torch::equal(other->fc1->weight, net->fc1->weight));
  CHECK(other_scaler->get_scale() == 65536.0);
  CHECK(other_scaler->options().growth_interval == 2000);
  // The scheduler continues where it was: two more steps reach step 4, where lr halves again.
  CHECK(other_sgd.param_groups()[0].options().get_lr() == 0.5);
  for (int i = 0; i < 2; ++i) {
    other_scheduler.step();
    scheduler.step();
  }
  CHECK(other_sgd.param_groups()[0].options().get_lr() == sgd.param_groups()[0].options().get_lr());
  CHECK(other_sgd.param_groups()[0].options().get_lr() == 0.25);
}

TEST_CASE("load: strict needs every requested key, the remainder comes back, filters keep items", "[checkpoint]") {
  auto fabric = cpu_fabric();
  Net net;
  const fs::path path = scratch("strict.ckpt");
  fabric.save(path, {{"model", net}, {"step", 5}, {"extra", std::string("kept")}},
              {{"model", [](const std::string& name, const c10::IValue&) { return name.rfind("fc1.", 0) == 0; }}});
  auto whole = fabric.load(path);
  CHECK(whole.at("model").toGenericDict().size() == 2);  // fc1.weight, fc1.bias only

  lf::State asks_more{{"step", 0}, {"epoch", 0}};
  CHECK_THROWS_WITH(fabric.load(path, asks_more), Contains("'epoch'") && Contains("strict=false"));
  auto remainder = fabric.load(path, asks_more, /*strict=*/false);
  CHECK(asks_more.at("step").to<int64_t>() == 5);
  CHECK(asks_more.at("epoch").to<int64_t>() == 0);
  CHECK(remainder.size() == 2);
  CHECK(remainder.at("extra").toStringRef() == "kept");

  Net other;
  lf::State strict_model{{"model", other}};
  CHECK_THROWS_WITH(fabric.load(path, strict_model), Contains("Missing keys") && Contains("fc2.weight"));
  CHECK_NOTHROW(fabric.load(path, strict_model, false));
  CHECK(torch::equal(other->fc1->weight, net->fc1->weight));
}

TEST_CASE("load refuses missing, folder, truncated and corrupted files clearly", "[checkpoint][errors]") {
  auto fabric = cpu_fabric();
  Net net;
  const fs::path path = scratch("good.ckpt");
  fabric.save(path, {{"model", net}});
  CHECK_THROWS_WITH(fabric.load(scratch("absent.ckpt")), Contains("does not exist"));
  CHECK_THROWS_WITH(fabric.load(scratch("")), Contains("is a folder"));
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(scratch("cut.ckpt"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  CHECK_THROWS_WITH(fabric.load(scratch("cut.ckpt")), Contains("truncated, corrupted"));
  // Corruption of each part of the archive is caught with a message that says which.
  auto corrupted = [&](const std::string& name, size_t at, size_t length) {
    std::string garbled = bytes;
    for (size_t i = at; i < at + length; ++i) garbled[i] ^= 0x5a;
    std::ofstream(scratch(name), std::ios::binary) << garbled;
    return scratch(name);
  };
  REQUIRE(bytes.compare(0, 4, "PK\x03\x04") == 0);
  CHECK_THROWS_WITH(fabric.load(corrupted("header.ckpt", 0, 4)), Contains("has no header") && Contains("header.ckpt"));
  // The tensor data of the first weight: past its local header's name and extra field.
  const size_t name_at = bytes.find("/data/0");
  REQUIRE(name_at != std::string::npos);
  const size_t local = bytes.rfind("PK\x03\x04", name_at);
  const size_t name_length = static_cast<unsigned char>(bytes[local + 26]) | static_cast<unsigned char>(bytes[local + 27]) << 8;
  const size_t extra_length = static_cast<unsigned char>(bytes[local + 28]) | static_cast<unsigned char>(bytes[local + 29]) << 8;
  const size_t data_at = local + 30 + name_length + extra_length;
  CHECK_THROWS_WITH(fabric.load(corrupted("data.ckpt", data_at + 4, 8)),
                    Contains("data.ckpt is corrupted: the checksum of entry") && Contains("data/0"));
  const size_t directory = bytes.find("PK\x01\x02");
  REQUIRE(directory != std::string::npos);
  CHECK_THROWS_WITH(fabric.load(corrupted("directory.ckpt", directory, 4)),
                    Contains("is not a readable checkpoint: a broken entry table"));
  CHECK_THROWS_WITH(fabric.save(scratch(""), {{"model", net}}), Contains("is a folder"));
  // Only the final file is left: no temporary beside it.
  for (const auto& entry : fs::directory_iterator(path.parent_path())) {
    CHECK(entry.path().filename().string().find(".tmp-") == std::string::npos);
  }
}

TEST_CASE("load_raw: a plain state dict, or a module written by torch::save", "[checkpoint]") {
  auto fabric = cpu_fabric();
  Net net;
  const fs::path raw = scratch("raw.pt");
  lf::save_state_dict_file(raw, lf::module_state_dict(*net));
  Net other;
  fabric.load_raw(raw, other);
  CHECK(same_parameters(net, other));

  const fs::path archive = scratch("archive.pt");
  torch::save(net, archive.string());
  Net third;
  fabric.load_raw(archive, third);
  CHECK(same_parameters(net, third));
  lf::StateDict partial = lf::make_state_dict();
  partial.insert("fc1.weight", net->fc1->weight.detach().clone());
  lf::save_state_dict_file(scratch("partial.pt"), partial);
  CHECK_THROWS_WITH(fabric.load_raw(scratch("partial.pt"), Net()), Contains("Missing keys"));
  CHECK_NOTHROW(fabric.load_raw(scratch("partial.pt"), Net(), /*strict=*/false));

  torch::optim::Adam adam(net->parameters());
  CHECK_THROWS_WITH(fabric.load_raw(raw, adam), Contains("\"state\""));
}

namespace {
// A user object checkpointed through lf::Stateful.
struct Tally : lf::Stateful {
  int64_t count = 0;
  std::string note;
  bool fail_with_c10_error = false;
  lf::StateDict state_dict() const override {
    TORCH_CHECK(!fail_with_c10_error, "tally cannot be read");
    lf::StateDict state = lf::make_state_dict();
    state.insert("count", count);
    state.insert("note", note);
    return state;
  }
  void load_state_dict(const lf::StateDict& state) override {
    LF_CHECK(state.contains("count"), ValueError, "Tally: no \"count\"");
    count = state.at("count").toInt();
    note = state.at("note").toStringRef();
  }
};
}  // namespace

TEST_CASE("a user's Stateful object saves, loads in place, and loads raw", "[checkpoint][stateful]") {
  auto fabric = cpu_fabric();
  Tally tally;  // borrowed
  tally.count = 12;
  tally.note = "epoch 3";
  auto shared = std::make_shared<Tally>();  // shared
  shared->count = 5;
  fabric.save(scratch("tally.ckpt"), {{"tally", tally}, {"shared", shared}, {"nested", lf::State{{"inner", tally}}}});
  CHECK(fabric.load(scratch("tally.ckpt")).at("tally").toGenericDict().at("count").toInt() == 12);

  Tally restored, inner;
  auto restored_shared = std::make_shared<Tally>();
  lf::State state{{"tally", restored}, {"shared", restored_shared}, {"nested", lf::State{{"inner", inner}}}};
  fabric.load(scratch("tally.ckpt"), state);
  CHECK(restored.count == 12);
  CHECK(restored.note == "epoch 3");
  CHECK(restored_shared->count == 5);
  CHECK(inner.count == 12);

  lf::StateDict raw = lf::make_state_dict();
  raw.insert("count", int64_t{9});
  raw.insert("note", std::string("raw"));
  lf::save_state_dict_file(scratch("tally-raw.pt"), raw);
  Tally from_raw;
  fabric.load_raw(scratch("tally-raw.pt"), from_raw);
  CHECK(from_raw.count == 9);
  lf::save_state_dict_file(scratch("not-a-tally.pt"), lf::make_state_dict());
  CHECK_THROWS_AS(fabric.load_raw(scratch("not-a-tally.pt"), from_raw), lf::ValueError);
}

TEST_CASE("a failing or null Stateful fails save clearly, whatever the exception type", "[checkpoint][stateful]") {
  auto fabric = cpu_fabric();
  Tally tally;
  tally.fail_with_c10_error = true;  // a c10::Error, as LibTorch raises: the same RuntimeError as any other
  CHECK_THROWS_AS(fabric.save(scratch("failing.ckpt"), {{"tally", tally}}), lf::RuntimeError);
  CHECK_THROWS_WITH(fabric.save(scratch("failing.ckpt"), {{"tally", tally}}),
                    Contains("failing.ckpt") && Contains("failed on rank 0") && Contains("tally cannot be read"));
  CHECK_FALSE(fs::exists(scratch("failing.ckpt")));
  std::shared_ptr<lf::Stateful> none;
  CHECK_THROWS_WITH(fabric.save(scratch("null.ckpt"), {{"none", none}}), Contains("null object"));
}
