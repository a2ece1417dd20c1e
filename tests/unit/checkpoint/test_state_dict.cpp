// State dicts share storage with what they describe, as PyTorch's do; lf::snapshot_state_dict
// takes a copy that does not change as training goes on (docs/user-guide.md, "The wrappers").
#include <torch/torch.h>

#include "lightning/fabric.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;

namespace {
lf::Fabric cpu_fabric() { return lf::Fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({})); }

bool same_tensors(const lf::StateDict& a, const lf::StateDict& b) {
  if (a.size() != b.size()) return false;
  for (const auto& item : a) {
    const auto other = b.find(item.key());
    if (other == b.end() || !torch::equal(item.value().toTensor(), other->value().toTensor())) return false;
  }
  return true;
}

lf::StateDict first_state(const lf::StateDict& optimizer_state) {
  const auto state = optimizer_state.at("state").toGenericDict();
  return state.begin()->value().toGenericDict();
}
}  // namespace

TEST_CASE("a snapshot keeps its values while training goes on; the state dict itself is live", "[state_dict]") {
  auto fabric = cpu_fabric();
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6), torch::nn::Linear(6, 2));
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.1));
  auto setup = fabric.setup(net, adam);  // (C++17 lambdas cannot capture structured bindings)
  auto& model = std::get<0>(setup);
  auto& optimizer = std::get<1>(setup);
  const auto step = [&] {
    optimizer.zero_grad();
    fabric.backward(model(torch::randn({8, 4})).pow(2).mean());
    optimizer.step();
  };
  step();

  const lf::StateDict live = model.state_dict();
  const lf::StateDict snapshot = lf::snapshot_state_dict(model.state_dict());
  const lf::StateDict expected = lf::snapshot_state_dict(live);  // a second, independent copy
  const lf::StateDict optimizer_snapshot = lf::snapshot_state_dict(lf::optimizer_state_dict(adam));
  const at::Tensor exp_avg_before = first_state(optimizer_snapshot).at("exp_avg").toTensor().clone();
  REQUIRE(same_tensors(live, snapshot));

  step();
  step();

  // PyTorch's semantics: state_dict() shares storage with the parameters and buffers.
  CHECK_FALSE(same_tensors(live, expected));
  CHECK(same_tensors(live, lf::module_state_dict(*net)));
  // The snapshot is what it was, parameters and running statistics alike.
  CHECK(same_tensors(snapshot, expected));
  CHECK_FALSE(same_tensors(snapshot, model.state_dict()));
  CHECK(torch::equal(first_state(optimizer_snapshot).at("exp_avg").toTensor(), exp_avg_before));
  CHECK_FALSE(torch::equal(first_state(lf::optimizer_state_dict(adam)).at("exp_avg").toTensor(), exp_avg_before));

  // Loading the snapshot brings the model back to the snapshot's values.
  model.load_state_dict(snapshot);
  CHECK(same_tensors(model.state_dict(), snapshot));
  for (const auto& item : snapshot) CHECK_FALSE(item.value().toTensor().requires_grad());
}
