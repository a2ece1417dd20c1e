// Throughput, ThroughputMonitor, measure_flops and available_flops (utilities/throughput.h).
#include <torch/torch.h>

#include "lightning/fabric.h"
#include "lightning/fabric/utilities/throughput.h"

#include <ATen/autocast_mode.h>
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

TEST_CASE("measure_flops counts a Linear as 2*N*in*out forward, and the backward's products", "[throughput]") {
  torch::nn::Linear linear(16, 8);
  const auto x = torch::randn({4, 16});
  const int64_t forward = 2 * 4 * 16 * 8;
  CHECK(lf::measure_flops(*linear, [&] { return linear(x); }) == forward);
  auto sum = [](const torch::Tensor& y) { return y.sum(); };
  // The input needs no gradient: the backward computes the weight's gradient only.
  CHECK(lf::measure_flops(*linear, [&] { return linear(x); }, sum) == 2 * forward);
  const auto x_grad = x.clone().requires_grad_();
  CHECK(lf::measure_flops(*linear, [&] { return linear(x_grad); }, sum) == 3 * forward);
  CHECK_FALSE(linear->weight.grad().defined());  // the count leaves no gradient behind
  linear->weight.mutable_grad() = torch::ones_like(linear->weight);
  lf::measure_flops(*linear, [&] { return linear(x); }, sum);
  CHECK(torch::equal(linear->weight.grad(), torch::ones_like(linear->weight)));  // nor adds to one there was
}

TEST_CASE("measure_flops counts a Conv2d from its output, kernel and input channels", "[throughput]") {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).padding(1));
  const auto x = torch::randn({2, 3, 10, 10});
  const int64_t forward = 2 * (2 * 8 * 10 * 10) * 3 * 3 * 3;  // 2 * output elements * Cin * kH * kW
  CHECK(lf::measure_flops(*conv, [&] { return conv(x); }) == forward);
  CHECK(lf::measure_flops(*conv, [&] { return conv(x); }, [](const torch::Tensor& y) { return y.sum(); }) == 2 * forward);
  torch::nn::Conv2d grouped(torch::nn::Conv2dOptions(4, 8, 3).groups(2));
  const auto g = torch::randn({1, 4, 6, 6});
  CHECK(lf::measure_flops(*grouped, [&] { return grouped(g); }) == 2 * (8 * 4 * 4) * (4 / 2) * 9);
}

namespace {
// CPU autocast to bfloat16 for one scope, as the bf16-mixed precision plugin sets it.
struct CpuAutocast {
  CpuAutocast() {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~CpuAutocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, false);
  }
};

// The count of forward (and, with a loss, backward) without autocast, which must equal the count
// under autocast: autocast re-dispatches each product once more, which must not count again.
int64_t count_alike_under_autocast(torch::nn::Module& module, const std::function<torch::Tensor()>& forward,
                                   bool with_backward) {
  const auto sum = [](const torch::Tensor& y) { return y.to(torch::kFloat).sum(); };
  const int64_t plain = with_backward ? lf::measure_flops(module, forward, sum) : lf::measure_flops(module, forward);
  CpuAutocast autocast;
  const int64_t cast = with_backward ? lf::measure_flops(module, forward, sum) : lf::measure_flops(module, forward);
  CHECK(cast == plain);
  return plain;
}
}  // namespace

TEST_CASE("measure_flops counts each product once under autocast", "[throughput]") {
  torch::nn::Linear linear(16, 8);
  const auto x2 = torch::randn({4, 16}), x3 = torch::randn({2, 4, 16});
  for (bool backward : {false, true}) {
    const int64_t passes = backward ? 2 : 1;  // the input needs no gradient: the weight's only
    CHECK(count_alike_under_autocast(*linear, [&] { return linear(x2); }, backward) == passes * 2 * 4 * 16 * 8);
    CHECK(count_alike_under_autocast(*linear, [&] { return linear(x3); }, backward) == passes * 2 * 8 * 16 * 8);
  }
  const auto a = torch::randn({4, 16}, torch::requires_grad()), b = torch::randn({16, 8});
  CHECK(count_alike_under_autocast(*linear, [&] { return torch::matmul(a, b); }, true) == 2 * (2 * 4 * 16 * 8));
  const auto p = torch::randn({3, 4, 16}), q = torch::randn({3, 16, 8});
  CHECK(count_alike_under_autocast(*linear, [&] { return torch::bmm(p, q); }, false) == 2 * 3 * 4 * 16 * 8);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).padding(1));
  const auto image = torch::randn({2, 3, 10, 10});
  const int64_t conv_forward = 2 * (2 * 8 * 10 * 10) * 3 * 3 * 3;
  CHECK(count_alike_under_autocast(*conv, [&] { return conv(image); }, false) == conv_forward);
  CHECK(count_alike_under_autocast(*conv, [&] { return conv(image); }, true) == 2 * conv_forward);
  const auto query = torch::randn({1, 2, 8, 16}), key = torch::randn({1, 2, 8, 16}), value = torch::randn({1, 2, 8, 16});
  CHECK(count_alike_under_autocast(
            *linear, [&] { return at::scaled_dot_product_attention(query, key, value); }, false) ==
        2 * 2 * 1 * 2 * 8 * 8 * 16);  // QK^T and PV
}

TEST_CASE("Throughput reports Python's metrics from running totals", "[throughput]") {
  lf::ThroughputOptions options;
  options.world_size = 2;
  options.window_size = 3;
  options.available_flops = 100.0;
  lf::Throughput throughput(options);
  throughput.update({1.0, 1, 4, 40, 100.0});
  throughput.update({2.0, 2, 8, 80, 100.0});
  auto early = throughput.compute();
  CHECK(early.at("batches") == 2);
  CHECK(early.count("device/batches_per_sec") == 0);  // the window is not full yet
  throughput.update({3.0, 3, 12, 120, 100.0});
  const auto metrics = throughput.compute();
  CHECK(metrics.at("time") == 3.0);
  CHECK(metrics.at("samples") == 12);
  CHECK(metrics.at("lengths") == 120);
  CHECK(metrics.at("device/batches_per_sec") == Approx(1.0));
  CHECK(metrics.at("device/samples_per_sec") == Approx(4.0));
  CHECK(metrics.at("device/items_per_sec") == Approx(40.0));
  CHECK(metrics.at("batches_per_sec") == Approx(2.0));
  CHECK(metrics.at("samples_per_sec") == Approx(8.0));
  CHECK(metrics.at("items_per_sec") == Approx(80.0));
  CHECK(metrics.at("flops_per_sec") == Approx(200.0));  // 2 devices * 100 FLOPs per second each
  CHECK(metrics.at("device/flops_per_sec") == Approx(100.0));
  CHECK(metrics.at("device/mfu") == Approx(1.0));
  throughput.reset();
  CHECK(throughput.compute().empty());
}

TEST_CASE("Throughput refuses inconsistent totals and a window of one", "[throughput][errors]") {
  lf::ThroughputOptions tiny;
  tiny.window_size = 1;
  CHECK_THROWS_WITH(lf::Throughput(tiny), Contains("window_size=1"));
  lf::Throughput throughput;
  CHECK_THROWS_WITH(throughput.update({1.0, 4, 2}), Contains("samples (2) must be at least batches (4)"));
  CHECK_THROWS_WITH(throughput.update({1.0, 1, 2, 1}), Contains("lengths (1) must be at least samples (2)"));
  throughput.update({1.0, 1, 2, 8});
  CHECK_THROWS_WITH(throughput.update({2.0, 2, 4}), Contains("always or never"));
}

namespace {
struct RecordingLogger : lf::Logger {
  std::vector<std::pair<std::map<std::string, double>, std::optional<int64_t>>> logged;
  std::string name() const override { return "recording"; }
  void log_metrics(const std::map<std::string, double>& metrics, std::optional<int64_t> step) override {
    logged.emplace_back(metrics, step);
  }
};
}  // namespace

TEST_CASE("ThroughputMonitor logs through fabric.log_dict, counting its steps", "[throughput]") {
  auto logger = std::make_shared<RecordingLogger>();
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").logger(logger), lf::env::map_env({}));
  lf::ThroughputOptions options;
  options.window_size = 2;
  lf::ThroughputMonitor monitor(fabric, options);
  CHECK(monitor.options().world_size == 1);
  CHECK_FALSE(monitor.options().available_flops);  // no table for CPUs
  monitor.update({0.5, 1, 8});
  monitor.update({1.0, 2, 16});
  const auto metrics = monitor.compute_and_log();
  CHECK(metrics.at("device/samples_per_sec") == Approx(16.0));
  monitor.compute_and_log();
  monitor.compute_and_log(10);
  REQUIRE(logger->logged.size() == 3);
  CHECK(logger->logged[0].second == 0);
  CHECK(logger->logged[1].second == 1);
  CHECK(logger->logged[2].second == 10);
  CHECK(logger->logged[0].first.at("samples") == 16);

  options.log_every_n_updates = 2;
  lf::ThroughputMonitor every_two(fabric, options);
  for (int64_t i = 1; i <= 5; ++i) every_two.update({0.5 * static_cast<double>(i), i, 8 * i});
  CHECK(logger->logged.size() == 3 + 2);  // after updates 2 and 4
  options.log_every_n_updates = -1;
  CHECK_THROWS_WITH(lf::Throughput(options), Contains("log_every_n_updates=-1"));
}

TEST_CASE("available_flops: dense peaks of current datacenter GPUs, none for CPUs", "[throughput]") {
  CHECK(*lf::available_flops("NVIDIA H200", torch::kBFloat16) == 989.4e12);
  CHECK(*lf::available_flops("NVIDIA H100 80GB HBM3", torch::kFloat16) == 989.4e12);
  CHECK(*lf::available_flops("NVIDIA H100 PCIe", torch::kBFloat16) == 756e12);
  CHECK(*lf::available_flops("NVIDIA H100 NVL", torch::kBFloat16) == 835.5e12);
  CHECK(*lf::available_flops("NVIDIA H200 NVL", torch::kFloat32) == 60e12);
  CHECK(*lf::available_flops("NVIDIA A100-SXM4-80GB", torch::kFloat32, /*tf32=*/true) == 156e12);
  CHECK(*lf::available_flops("NVIDIA A100-SXM4-80GB", torch::kFloat32) == 19.5e12);
  CHECK(*lf::available_flops("NVIDIA B200", torch::kBFloat16) == 2.25e15);
  CHECK_FALSE(lf::available_flops("Tesla T4", torch::kFloat16));
  CHECK_FALSE(lf::available_flops("NVIDIA H200", torch::kInt8));
  CHECK_FALSE(lf::available_flops(torch::Device(torch::kCPU), torch::kFloat32));
}
