// GPU checks (CTest label "gpu"): single-device Fabric on CUDA. Without a CUDA LibTorch and a
// visible GPU the binary prints why and exits 77, which CTest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "lightning/fabric.h"
#include "lightning/fabric/connector.h"
#include "lightning/fabric/checkpoint/background_write.h"
#include "lightning/fabric/utilities/process.h"
#include "lightning/fabric/plugins/collectives/collective.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;

TEST_CASE("cuda: auto picks the GPU, setup moves the module, inputs follow", "[gpu]") {
  lf::Fabric fabric(lf::FabricOptions(), lf::env::map_env({}));
  CHECK(fabric.config().accelerator == "cuda");
  CHECK(fabric.device() == torch::Device(torch::kCUDA, 0));
  torch::nn::Linear net(8, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  CHECK(net->weight.device().is_cuda());
  auto out = model(torch::randn({4, 8}));  // a CPU input is moved to the GPU
  CHECK(out.device().is_cuda());
  fabric.backward(out.sum());
  CHECK(optimizer.step());
}

TEST_CASE("cuda: devices lists select GPUs by index", "[gpu]") {
  const int count = static_cast<int>(torch::cuda::device_count());
  lf::Fabric fabric(lf::FabricOptions().accelerator("gpu").devices(std::vector<int>{count - 1}), lf::env::map_env({}));
  CHECK(fabric.device() == torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(count - 1)));
}

TEST_CASE("cuda: under lightning-run --virtual-local-rank each process runs on its one visible GPU, device 0", "[gpu]") {
  // What a worker of `lightning-run --virtual-local-rank --devices 4` sees: LOCAL_RANK=0 in every
  // worker and CUDA_VISIBLE_DEVICES holding its own GPU (so one GPU is enough to check it here).
  const std::map<std::string, std::string> worker{
      {"TORCHELASTIC_RUN_ID", "job"}, {"RANK", "3"},          {"GROUP_RANK", "0"},         {"LOCAL_RANK", "0"},
      {"LOCAL_WORLD_SIZE", "4"},      {"WORLD_SIZE", "4"},    {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
      {"LT_CLI_USED", "1"},           {"LT_ACCELERATOR", "cuda"}, {"LT_DEVICES", "4"},     {"LT_NUM_NODES", "1"},
      {"LT_VIRTUAL_LOCAL_RANK", "1"}};
  const auto config = lf::resolve_config(lf::FabricOptions(), lf::env::map_env(worker));
  CHECK(config.accelerator == "cuda");
  CHECK(config.device_indices == std::vector<int>{0, 0, 0, 0});  // 4 processes on the node, each on its device 0
  auto connector = lf::Connector::build(lf::FabricOptions(), lf::env::map_env(worker));
  CHECK(connector.strategy->root_device() == torch::Device(torch::kCUDA, 0));
}

TEST_CASE("cuda: the Fabric loop matches the raw loop on the same GPU", "[gpu]") {
  torch::manual_seed(3);
  torch::nn::Linear raw(16, 4);
  raw->to(torch::kCUDA);
  torch::optim::SGD raw_sgd(raw->parameters(), 0.05);
  lf::Fabric fabric(lf::FabricOptions().accelerator("cuda").devices(1), lf::env::map_env({}));
  torch::manual_seed(3);
  torch::nn::Linear net(16, 4);
  torch::optim::SGD sgd(net->parameters(), 0.05);
  auto [model, optimizer] = fabric.setup(net, sgd);
  torch::manual_seed(11);
  for (int step = 0; step < 20; ++step) {
    auto x = torch::randn({8, 16}, torch::kCUDA);
    raw_sgd.zero_grad();
    raw(x).pow(2).mean().backward();
    raw_sgd.step();
    optimizer.zero_grad();
    fabric.backward(model(x).pow(2).mean());
    optimizer.step();
  }
  CHECK(torch::allclose(raw->weight, net->weight));
}

TEST_CASE("cuda: save_in_background copies the GPU state once, into pinned memory, and writes fabric.save's bytes",
          "[gpu][background]") {
  const at::Tensor on_gpu = torch::arange(1024, torch::TensorOptions().device(torch::kCUDA));
  lf::StateDict state = lf::make_state_dict();
  state.insert("weight", on_gpu);
  {
    lf::HostBufferPool pool;
    lf::HostCopyScope scope(pool);
    CHECK(lf::saved_tensor(on_gpu).is_cuda());  // left on the device for host_copy
    const at::Tensor copied = lf::host_copy(state).toGenericDict().at("weight").toTensor();
    CHECK(copied.device().is_cpu());
    CHECK(copied.is_pinned());
    CHECK(torch::equal(copied, on_gpu.cpu()));
  }
  CHECK(lf::saved_tensor(on_gpu).device().is_cpu());  // outside a background save: on the CPU at once

  lf::Fabric fabric(lf::FabricOptions().accelerator("cuda").devices(1), lf::env::map_env({}));
  torch::manual_seed(4);
  torch::nn::Linear net(64, 8);
  torch::optim::Adam adam(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, adam);
  fabric.backward(model(torch::randn({4, 64})).sum());
  optimizer.step();
  const std::filesystem::path folder = lf::make_temporary_directory("lf-gpu-background");
  fabric.save(folder / "sync.ckpt", {{"model", net}, {"optimizer", adam}});
  fabric.save_in_background(folder / "background.ckpt", {{"model", net}, {"optimizer", adam}});
  fabric.backward(model(torch::randn({4, 64})).sum());  // training goes on, on the GPU
  optimizer.step();
  fabric.wait_for_background_save();
  auto bytes = [](const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  CHECK(bytes(folder / "background.ckpt") == bytes(folder / "sync.ckpt"));
  std::filesystem::remove_all(folder);
}

// The backward of CUDA tensors runs on the autograd engine's thread for the GPU, which the count's
// thread-local callback reaches through the engine's thread-local state.
TEST_CASE("cuda: measure_flops counts the backward that runs on the GPU's autograd thread", "[gpu]") {
  torch::nn::Linear net(16, 8);
  net->to(torch::kCUDA);
  const auto x = torch::randn({4, 16}, torch::kCUDA);
  const auto x_grad = x.clone().requires_grad_();
  const auto sum = [](const torch::Tensor& y) { return y.sum(); };
  const int64_t forward = 2 * 4 * 16 * 8;
  CHECK(lf::measure_flops(*net, [&] { return net(x); }) == forward);
  CHECK(lf::measure_flops(*net, [&] { return net(x_grad); }, sum) == 3 * forward);
  lf::Fabric fabric(lf::FabricOptions().accelerator("cuda").devices(1), lf::env::map_env({}));
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto setup = fabric.setup(net, sgd);
  auto& model = std::get<0>(setup);
  CHECK(lf::measure_flops(model, [&] { return model(x); }, sum) == 2 * forward);  // the weight's gradient only
}

// Hidden ([.]): run under lightning-run, which provides the rendezvous:
//   lightning-run model --accelerator cuda --devices 1 --strategy ddp lf_gpu_tests "[nccl]"
TEST_CASE("cuda: an nccl process group with world size 1 reduces and trains", "[.][nccl]") {
  lf::DDPOptions ddp;
  ddp.process_group.backend = lf::ProcessGroupBackend::Nccl;
  lf::Fabric fabric(lf::FabricOptions().accelerator("cuda").devices(1).strategy(lf::ddp_strategy(ddp)));
  auto reduced = fabric.all_reduce(torch::ones({4}, torch::kCUDA), "sum");
  CHECK(torch::equal(reduced.cpu(), torch::ones({4})));
  torch::nn::Linear net(8, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  fabric.backward(model(torch::randn({4, 8})).sum());
  CHECK(optimizer.step());
  CHECK(fabric.strategy_as<lf::DDPStrategy>().collective().backend() == lf::ProcessGroupBackend::Nccl);
}

// --has-gpu: exit 0 with a GPU, 77 without (CTest runs it before lightning-run --accelerator cuda).
int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::cout << "SKIPPED: no CUDA GPU visible to this LibTorch (a CPU build, or no device)." << std::endl;
    return 77;
  }
  if (argc == 2 && std::string(argv[1]) == "--has-gpu") return 0;
  const int failed = Catch::Session().run(argc, argv);  // the number of failed assertions
  return failed == 77 ? 1 : failed;                     // 77 would read as a skip
}
