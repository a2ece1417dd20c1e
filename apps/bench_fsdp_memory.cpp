// P6: bytes of parameters + gradients + optimizer state each rank holds after an Adam step, under
// ddp and fsdp's sharding strategies, against the ZeRO formulas for fp32 Adam (Psi parameters,
// N ranks): ddp 16 Psi; SHARD_GRAD_OP (ZeRO-2) 4 Psi + 12 Psi / N; FULL_SHARD (ZeRO-3) 16 Psi / N.
// Run under lightning-run:
//   lightning-run model --accelerator cpu --devices 2 build/bin/bench_fsdp_memory FULL_SHARD
// With --save DIR it also writes a sharded checkpoint of the model (P7's input).
#include <lightning/fabric.h>
#include <torch/torch.h>

#include <iostream>

namespace lf = lightning::fabric;

namespace {
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t width)
      : fc1(register_module("fc1", torch::nn::Linear(784, width))),
        fc2(register_module("fc2", torch::nn::Linear(width, width))),
        fc3(register_module("fc3", torch::nn::Linear(width, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

int64_t bytes_of(const at::Tensor& tensor) {
  return tensor.defined() ? tensor.numel() * static_cast<int64_t>(tensor.element_size()) : 0;
}

int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& item : optimizer.state()) {
    if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(item.second.get())) {
      bytes += bytes_of(adam->exp_avg()) + bytes_of(adam->exp_avg_sq()) + bytes_of(adam->max_exp_avg_sq());
    }
  }
  return bytes;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string strategy = argc > 1 ? argv[1] : "ddp";
  std::string save_dir;
  int64_t width = 1024;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--save") save_dir = argv[i + 1];
    if (std::string(argv[i]) == "--width") width = std::stoll(argv[i + 1]);
  }
  lf::FabricOptions options;
  options.accelerator("cpu");
  if (strategy == "ddp") {
    options.strategy("ddp");
  } else {
    lf::FSDPOptions fsdp;
    fsdp.sharding_strategy = lf::parse_sharding_strategy(strategy);
    options.strategy(lf::fsdp_strategy(fsdp));
  }
  lf::Fabric fabric(options);
  fabric.seed_everything(0);
  Mlp net(width);
  int64_t psi = 0;
  for (const auto& parameter : net->parameters()) psi += parameter.numel();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  auto [model, optimizer] = fabric.setup(net, adam);
  for (int step = 0; step < 2; ++step) {
    optimizer.zero_grad();
    fabric.backward(torch::nn::functional::cross_entropy(model(torch::randn({32, 784})), torch::randint(10, {32})));
    optimizer.step();
  }
  int64_t held = optimizer_state_bytes(adam);
  if (auto* fsdp = dynamic_cast<lf::FSDPStrategy*>(fabric.strategy().get())) {
    held += fsdp->resident_bytes();
  } else {
    for (const auto& parameter : net->parameters()) held += bytes_of(parameter) + bytes_of(parameter.grad());
  }
  const double n = fabric.world_size(), p = static_cast<double>(psi);
  const double formula = strategy == "FULL_SHARD"      ? 16 * p / n
                         : strategy == "SHARD_GRAD_OP" ? 4 * p + 12 * p / n
                                                       : 16 * p;
  const auto most = fabric.all_reduce(torch::tensor(static_cast<double>(held), torch::kFloat64), "max").item<double>();
  if (fabric.is_global_zero()) {
    std::cout << "{\"benchmark\":\"P6 memory\",\"strategy\":\"" << strategy << "\",\"ranks\":" << fabric.world_size()
              << ",\"parameters\":" << psi << ",\"max_bytes_per_rank\":" << static_cast<int64_t>(most)
              << ",\"formula_bytes\":" << static_cast<int64_t>(formula) << ",\"ratio\":" << most / formula << "}"
              << std::endl;
  }
  if (!save_dir.empty()) fabric.save(save_dir, {{"model", model}, {"optimizer", optimizer}});
  return 0;
}
