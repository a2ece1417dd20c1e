// Throughput, ThroughputMonitor, measure_flops and available_flops (utilities/throughput.h).
#include <torch/torch.h>

#include <cmath>

#include "lightning/fabric.h"
#include "lightning/fabric/utilities/throughput.h"

#include <ATen/autocast_mode.h>

#include <atomic>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>
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

TEST_CASE("measure_flops on a set-up model counts what the raw module counts", "[throughput]") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").devices(1), lf::env::map_env({}));
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 8));
  torch::optim::SGD sgd(net->parameters(), 0.1);
  const auto x = torch::randn({4, 16});
  const auto sum = [](const torch::Tensor& y) { return y.sum(); };
  const int64_t raw_forward = lf::measure_flops(*net, [&] { return net->forward(x); });
  const int64_t raw_step = lf::measure_flops(*net, [&] { return net->forward(x); }, sum);
  CHECK(raw_forward == 2 * 4 * 16 * 32 + 2 * 4 * 32 * 8);
  // The first Linear's input needs no gradient (its weight's only: 1x), the second's does (2x).
  CHECK(raw_step == 2 * (2 * 4 * 16 * 32) + 3 * (2 * 4 * 32 * 8));
  auto setup = fabric.setup(net, sgd);
  auto& model = std::get<0>(setup);
  CHECK(lf::measure_flops(model, [&] { return model(x); }) == raw_forward);
  // The count's backward is its own: a set-up model's outputs accept it, and it leaves no gradient.
  CHECK(lf::measure_flops(model, [&] { return model(x); }, sum) == raw_step);
  CHECK(lf::measure_flops(*model, [&] { return model(x); }, sum) == raw_step);
  for (const auto& parameter : net->parameters()) CHECK_FALSE(parameter.grad().defined());
  // A plain backward on the model's output is still refused outside the count.
  CHECK_THROWS_WITH(model(x).sum().backward(), Contains("fabric.backward(loss)"));
  fabric.backward(model(x).sum());
  CHECK(net->parameters().front().grad().defined());
}

TEST_CASE("measure_flops counts right after a measurement that threw", "[throughput]") {
  torch::nn::Linear linear(16, 8);
  const auto x = torch::randn({4, 16});
  const int64_t forward = 2 * 4 * 16 * 8;
  const auto sum = [](const torch::Tensor& y) { return y.sum(); };
  // Thrown inside a counted product (shapes that do not multiply), after one that counted.
  CHECK_THROWS(lf::measure_flops(*linear, [&] {
    linear(x);
    return torch::mm(x, torch::ones({3, 5}));
  }));
  CHECK(lf::measure_flops(*linear, [&] { return linear(x); }) == forward);
  // Thrown from the backward (a gradient hook), between the counted products of forward and backward.
  CHECK_THROWS(lf::measure_flops(*linear, [&] { return linear(x); }, [](const torch::Tensor& y) {
    auto z = y * 2;
    z.register_hook([](const torch::Tensor&) { throw std::runtime_error("a hook that fails"); });
    return z.sum();
  }));
  CHECK(lf::measure_flops(*linear, [&] { return linear(x); }, sum) == 2 * forward);
  CHECK_FALSE(linear->weight.grad().defined());  // the failed count's gradients were dropped too
  // A measurement inside another one is refused, and leaves the next one right.
  CHECK_THROWS_WITH(lf::measure_flops(*linear, [&] {
    lf::measure_flops(*linear, [&] { return linear(x); });
    return linear(x);
  }), Contains("inside another measure_flops"));
  CHECK(lf::measure_flops(*linear, [&] { return linear(x); }) == forward);
}

TEST_CASE("measure_flops does not count products running on another thread", "[throughput]") {
  torch::nn::Linear linear(16, 8);
  const auto x = torch::randn({4, 16});
  std::atomic<bool> stop{false};
  std::atomic<int64_t> products{0};
  std::thread other([&] {
    const auto a = torch::randn({32, 32});
    while (!stop) {
      torch::mm(a, a);
      ++products;
    }
  });
  lf::ScopeGuard join([&] {
    stop = true;
    other.join();
  });
  // forward_fn waits until the other thread has multiplied twice while the count runs.
  const int64_t counted = lf::measure_flops(*linear, [&] {
    const int64_t before = products.load();
    while (products.load() < before + 2) std::this_thread::yield();
    return linear(x);
  });
  CHECK(counted == 2 * 4 * 16 * 8);
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
// What fn prints to std::cerr, where rank_zero_warn writes.
template <class Fn>
std::string stderr_of(Fn&& fn) {
  std::ostringstream text;
  std::streambuf* previous = std::cerr.rdbuf(text.rdbuf());
  lf::ScopeGuard restore([previous] { std::cerr.rdbuf(previous); });
  fn();
  return text.str();
}
}  // namespace

TEST_CASE("Throughput refuses totals that do not increase, as Python's monotonic window", "[throughput][errors]") {
  lf::ThroughputOptions options;
  options.window_size = 2;
  lf::Throughput throughput(options);
  throughput.update({2.0, 1, 2, 4});
  throughput.update({2.5, 2, 4, 8});
  CHECK_THROWS_AS(throughput.update({2.5, 3, 6, 12}), lf::ValueError);
  CHECK_THROWS_WITH(throughput.update({2.5, 3, 6, 12}),
                    Contains("Expected the value to increase, last: 2.5, current: 2.5") && Contains("(time)"));
  CHECK_THROWS_WITH(throughput.update({2.4, 3, 6, 12}), Contains("(time)"));
  CHECK_THROWS_WITH(throughput.update({3.0, 2, 6, 12}), Contains("last: 2, current: 2") && Contains("(batches)"));
  CHECK_THROWS_WITH(throughput.update({3.0, 3, 4, 12}), Contains("(samples)"));
  CHECK_THROWS_WITH(throughput.update({3.0, 3, 6, 8}), Contains("(lengths)"));
  // A refused update changes nothing.
  const auto metrics = throughput.compute();
  CHECK(metrics.at("time") == 2.5);
  CHECK(metrics.at("device/batches_per_sec") == Approx(2.0));
  throughput.update({3.0, 3, 6, 12});
  CHECK(throughput.compute().at("batches") == 3);
  throughput.reset();
  throughput.update({0.5, 1, 1});  // reset starts the totals over
  CHECK(throughput.compute().at("time") == 0.5);
  lf::Throughput fresh(options);  // a NaN time is refused, also as the first total
  CHECK_THROWS_WITH(fresh.update({std::nan(""), 1, 1}), Contains("time is NaN"));
}

TEST_CASE("Throughput: using_sparse_model scales the peak by sparse_cuda_acceleration_factor, as Python", "[throughput]") {
  lf::ThroughputOptions options;
  options.available_flops = 100.0;
  options.using_sparse_model = false;
  CHECK(*lf::Throughput(options).options().available_flops == 100.0);
  options.using_sparse_model = true;
  CHECK(*lf::Throughput(options).options().available_flops == 200.0);  // the default factor, 2
  options.sparse_cuda_acceleration_factor = 4.0;
  CHECK(*lf::Throughput(options).options().available_flops == 400.0);
  options.available_flops.reset();  // no peak: nothing to scale, no error
  CHECK_FALSE(lf::Throughput(options).options().available_flops);
  options.available_flops = 100.0;
  options.sparse_cuda_acceleration_factor = 0.5;
  CHECK_THROWS_AS(lf::Throughput(options), lf::ValueError);
  CHECK_THROWS_WITH(lf::Throughput(options), Contains("sparse_cuda_acceleration_factor=0.5") &&
                                                 Contains("sparse acceleration factor cannot reduce"));

  // MFU against the scaled peak: 10 FLOP/s over 50 dense, over 100 sparse.
  for (const bool sparse : {false, true}) {
    lf::ThroughputOptions mfu;
    mfu.available_flops = 50.0;
    mfu.window_size = 2;
    mfu.using_sparse_model = sparse;
    lf::Throughput throughput(mfu);
    throughput.update({1.0, 1, 2, std::nullopt, 10.0});
    throughput.update({2.0, 2, 4, std::nullopt, 10.0});
    CHECK(throughput.compute().at("device/mfu") == Approx(sparse ? 0.1 : 0.2));
  }
}

TEST_CASE("Throughput warns that MFU assumes dense FLOPs unless using_sparse_model is set", "[throughput]") {
  lf::ThroughputOptions options;
  options.available_flops = 100.0;
  CHECK_THAT(stderr_of([&] { lf::Throughput throughput(options); }), Contains("MFU assumes dense model FLOPs"));
  CHECK(*lf::Throughput(options).options().available_flops == 100.0);  // the dense peak, unscaled
  for (const bool sparse : {false, true}) {  // an explicit choice silences it
    options.using_sparse_model = sparse;
    CHECK_THAT(stderr_of([&] { lf::Throughput throughput(options); }), !Contains("MFU assumes"));
  }
  // No peak: no MFU, nothing to warn about.
  CHECK_THAT(stderr_of([] { lf::Throughput throughput; }), !Contains("MFU assumes"));
}

TEST_CASE("available_flops warns and gives nothing for an unknown GPU or dtype, as Python", "[throughput]") {
  std::optional<double> peak = 1.0;
  const std::string unknown = stderr_of([&] { peak = lf::available_flops("CocoNut", torch::kBFloat16); });
  CHECK_FALSE(peak);
  CHECK_THAT(unknown, Contains("FLOPs not found for 'CocoNut'"));
  peak = 1.0;
  const std::string dtype = stderr_of([&] { peak = lf::available_flops("NVIDIA H200", torch::kInt8); });
  CHECK_FALSE(peak);
  CHECK_THAT(dtype, Contains("'NVIDIA H200' does not support torch.int8"));
  const std::string known = stderr_of([&] { peak = lf::available_flops("NVIDIA H100 PCIe", torch::kBFloat16); });
  REQUIRE(peak);
  CHECK(*peak == 756e12);
  CHECK_THAT(known, !Contains("FLOPs not found") && !Contains("does not support"));
  // A CPU has no table: nothing, silently (Python's get_available_flops does not warn for it either).
  const std::string cpu = stderr_of([&] { peak = lf::available_flops(torch::Device(torch::kCPU), torch::kFloat32); });
  CHECK_FALSE(peak);
  CHECK_THAT(cpu, !Contains("FLOPs not found"));
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
