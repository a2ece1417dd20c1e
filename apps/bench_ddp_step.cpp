// P3: median step time of DDP on CPU through Fabric. Run under lightning-run (or alone for one
// rank); rank 0 prints one JSON object. Same model, data and thread count as
// scripts/bench_ddp_python.py, its Python torch DDP twin.
//   lightning-run model --accelerator cpu --devices 2 bench_ddp_step 784-1024-1024-10 64 200 30
#include <lightning/fabric.h>
#include <lightning/fabric/plugins/collectives/collective.h>
#include <lightning/fabric/strategies/parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>

namespace lf = lightning::fabric;

int main(int argc, char** argv) {
  const std::string layout = argc > 1 ? argv[1] : "784-1024-1024-10";
  const int batch = argc > 2 ? std::stoi(argv[2]) : 64;
  const int steps = argc > 3 ? std::stoi(argv[3]) : 200;
  const int warmup = argc > 4 ? std::stoi(argv[4]) : 30;
  // "no-sync": the same step with the gradient all-reduce skipped (no_backward_sync), to show how
  // much of the communication the overlap with backward hides. "bn": a BatchNorm1d after every
  // hidden Linear, its buffers broadcast before each forward (DDPOptions::broadcast_buffers, the
  // default); "bn-no-broadcast": the same model with the broadcast off, to show what it costs.
  const std::string mode = argc > 5 ? argv[5] : "sync";
  const bool no_sync = mode == "no-sync";
  const bool batch_norm = mode == "bn" || mode == "bn-no-broadcast";
  std::vector<int64_t> sizes;
  std::stringstream parts(layout);
  for (std::string part; std::getline(parts, part, '-');) sizes.push_back(std::stoll(part));

  torch::set_num_threads(1);
  lf::DDPOptions ddp;
  ddp.broadcast_buffers = mode != "bn-no-broadcast";
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy(lf::ddp_strategy(ddp)));
  lf::Fabric::seed_everything(0);
  torch::nn::Sequential net;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    net->push_back(torch::nn::Linear(sizes[i], sizes[i + 1]));
    if (i + 2 < sizes.size() && batch_norm) net->push_back(torch::nn::BatchNorm1d(sizes[i + 1]));
    if (i + 2 < sizes.size()) net->push_back(torch::nn::ReLU());
  }
  torch::optim::SGD sgd(net->parameters(), 0.01);
  auto wrapped = fabric.setup(net, sgd);
  auto& model = std::get<0>(wrapped);
  auto& optimizer = std::get<1>(wrapped);
  const auto x = torch::randn({batch, sizes.front()});
  const auto y = torch::randint(sizes.back(), {batch});
  std::vector<double> times;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model(x), y);
    {
      auto skip = fabric.no_backward_sync(model, no_sync);
      fabric.backward(loss);
    }
    optimizer.step();
    if (i >= warmup) times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  // "bn": also the buffer broadcast's own time, as before_forward runs it (the module's buffers packed
  // into one broadcast from rank 0 over the data group), timed back to back after the steps:
  // measured in the same process, so it is not lost in the noise between runs.
  double broadcast_ms = 0.0;
  auto* parallel = dynamic_cast<lf::ParallelStrategy*>(fabric.strategy().get());
  if (mode == "bn" && parallel != nullptr && fabric.world_size() > 1) {
    std::vector<at::Tensor> buffers;
    for (const auto& buffer : net->buffers()) buffers.push_back(buffer.data());
    lf::Collective& group = *parallel->shared_data_group();
    std::vector<double> calls;
    for (int i = 0; i < warmup + steps; ++i) {
      const auto start = std::chrono::steady_clock::now();
      group.broadcast_many_(buffers, 0, size_t{250} << 20);
      if (i >= warmup) calls.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(calls.begin(), calls.end());
    broadcast_ms = calls[calls.size() / 2];
  }
  if (fabric.is_global_zero()) {
    std::cout << "{\"impl\":\"lightning-fabric-cpp\",\"layout\":\"" << layout << "\",\"batch_per_rank\":" << batch
              << ",\"world_size\":" << fabric.world_size() << ",\"mode\":\"" << mode << "\",\"steps\":" << steps
              << ",\"median_step_ms\":" << times[times.size() / 2];
    if (mode == "bn") std::cout << ",\"median_buffer_broadcast_ms\":" << broadcast_ms;
    std::cout << "}" << std::endl;
  }
  return 0;
}
