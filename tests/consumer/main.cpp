// Trains a linear model for a few steps through the installed library and checks the loss fell;
// then derives a strategy from the installed ParallelStrategy and a state object from Stateful,
// as docs/distributed.md and docs/checkpoints.md show (their vtables cross the library boundary).
#include <lightning/fabric.h>
#include <torch/torch.h>

#include <iostream>

namespace lf = lightning::fabric;

struct CountingDDP : lf::ParallelStrategy {
  explicit CountingDDP(lf::StrategyContext context) : ParallelStrategy(std::move(context), lf::ProcessGroupSettings()) {}
  std::string name() const override { return "counting_ddp"; }
};

struct BestMetric : lf::Stateful {
  double best = 1e9;
  lf::StateDict state_dict() const override {
    lf::StateDict state = lf::make_state_dict();
    state.insert("best", best);
    return state;
  }
  void load_state_dict(const lf::StateDict& state) override {
    LF_CHECK(state.contains("best") && state.at("best").isDouble(), ValueError,
             "BestMetric: the state dict needs a float \"best\"");
    best = state.at("best").toDouble();
  }
};

bool user_extensions_work() {
  lf::strategy_registry().add("counting_ddp", [](lf::StrategyContext context) {
    return std::make_shared<CountingDDP>(std::move(context));
  });
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy("counting_ddp"));
  bool ok = fabric.strategy_as<CountingDDP>().name() == "counting_ddp";
  try {
    fabric.strategy_as<lf::FSDPStrategy>();
    ok = false;
  } catch (const lf::TypeError&) {  // thrown inside the library, caught here
  }
  BestMetric metric;
  metric.best = 0.25;
  const lf::StateDict saved = lf::StateEntry(metric).object().state_dict();
  BestMetric restored;
  lf::load_state_dict_into(restored, saved);
  try {  // a user's error from load_state_dict reaches the caller unchanged
    lf::load_state_dict_into(restored, lf::make_state_dict());
    ok = false;
  } catch (const lf::ValueError&) {
  }
  return ok && restored.best == 0.25;
}

int main() {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"));
  fabric.seed_everything(7);
  torch::nn::Linear net(4, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  auto x = torch::randn({64, 4});
  auto y = x.sum(1, true);
  double first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model(x), y);
    fabric.backward(loss);
    optimizer.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  std::cout << "consumer: lightning-fabric " << lf::kVersion << " loss " << first << " -> " << last << std::endl;
  if (!user_extensions_work()) {
    std::cerr << "consumer: a user strategy or Stateful object did not work through the installed library" << std::endl;
    return 1;
  }
  return last < first * 0.1 ? 0 : 1;
}
