// Pipeline schedules without processes: each rank's order, that every schedule runs every
// forward and backward once and never deadlocks, the simulated bubble against the textbook
// (p - 1) / (m + p - 1), the refusals of schedules and of every pipeline option; lf::Pipeline's
// split of its layers and its refusals; the mesh asked for before it forms.
#include <torch/nn/modules/linear.h>

#include <functional>
#include <set>
#include <string>
#include <tuple>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/fabric.h"
#include "lightning/fabric/strategies/pipeline.h"
#include "lightning/fabric/strategies/pipeline_schedule.h"
#include "lightning/fabric/utilities/env_vars.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;
using Kind = lf::PipelineAction::Kind;

namespace {
std::string spelled(const std::vector<lf::PipelineAction>& actions) {
  std::string out;
  for (const auto& a : actions) {
    out += (out.empty() ? "" : " ") + std::string(a.kind == Kind::Forward ? "F" : "B") + std::to_string(a.micro_batch);
  }
  return out;
}
}  // namespace

TEST_CASE("1F1B: warmup forwards, then one forward and one backward in turn") {
  CHECK(spelled(lf::pipeline_actions("1F1B", 4, 0, 1, 6)) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  CHECK(spelled(lf::pipeline_actions("1F1B", 4, 2, 1, 6)) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  CHECK(spelled(lf::pipeline_actions("1F1B", 4, 3, 1, 6)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  CHECK(spelled(lf::pipeline_actions("GPipe", 4, 1, 1, 3)) == "F0 F1 F2 B0 B1 B2");
}

TEST_CASE("every schedule runs each stage's forwards and backwards once, a forward before its backward") {
  for (const auto& [schedule, pipe, per_rank, micro_batches] :
       {std::tuple{"GPipe", 4, 1, 4}, std::tuple{"1F1B", 4, 1, 8}, std::tuple{"1F1B", 3, 1, 2},
        std::tuple{"GPipe", 2, 3, 5}, std::tuple{"Interleaved1F1B", 2, 2, 4}, std::tuple{"Interleaved1F1B", 4, 3, 8}}) {
    CAPTURE(schedule, pipe, per_rank, micro_batches);
    for (int rank = 0; rank < pipe; ++rank) {
      std::set<std::tuple<int, int, int>> seen;
      for (const auto& a : lf::pipeline_actions(schedule, pipe, rank, per_rank, micro_batches)) {
        CHECK(a.stage % pipe == rank);
        if (a.kind == Kind::Backward) CHECK(seen.count({0, a.stage, a.micro_batch}) == 1);
        CHECK(seen.insert({a.kind == Kind::Forward ? 0 : 1, a.stage, a.micro_batch}).second);
      }
      CHECK(seen.size() == static_cast<size_t>(2 * per_rank * micro_batches));
    }
    CHECK_NOTHROW(lf::simulated_bubble(schedule, pipe, per_rank, micro_batches));
  }
}

TEST_CASE("GPipe and 1F1B idle the textbook (p - 1) / (m + p - 1); interleaving idles less") {
  for (int pipe : {2, 4, 8}) {
    for (int m : {4, 8}) {
      const double textbook = (pipe - 1.0) / (m + pipe - 1.0);
      CHECK(lf::simulated_bubble("GPipe", pipe, 1, m) == Approx(textbook).epsilon(1e-12));
      CHECK(lf::simulated_bubble("1F1B", pipe, 1, m) == Approx(textbook).epsilon(1e-12));
      if (m % pipe == 0) CHECK(lf::simulated_bubble("Interleaved1F1B", pipe, 2, m) < textbook);
    }
  }
}

TEST_CASE("schedules are refused with the bad value and the fix") {
  CHECK_THROWS_WITH(lf::check_pipeline_schedule("PipelineOptions", "ZeroBubble", 2, 1, 4),
                    Contains("schedule=\"ZeroBubble\" is not valid") && Contains("\"GPipe\""));
  CHECK_THROWS_WITH(lf::check_pipeline_schedule("PipelineOptions", "1F1B", 2, 2, 4),
                    Contains("stages_per_rank=2") && Contains("Interleaved1F1B"));
  CHECK_THROWS_WITH(lf::check_pipeline_schedule("PipelineOptions", "Interleaved1F1B", 4, 2, 6),
                    Contains("micro_batches=6 is not a multiple of 4") && Contains("micro_batches=8"));
  CHECK_THROWS_WITH(lf::check_pipeline_schedule("PipelineOptions", "GPipe", 2, 1, 0), Contains("micro_batches=0"));
  CHECK_THROWS_WITH(lf::check_pipeline_schedule("PipelineOptions", "Interleaved1F1B", 2, 1, 4),
                    Contains("needs several stages per rank, but stages_per_rank=1"));
  CHECK_THROWS_AS(lf::pipeline_strategy([] { lf::PipelineOptions o; o.micro_batches = -1; return o; }()), lf::ValueError);
}

// The option checks run in lf::pipeline_strategy, on every rank alike before any process talks to
// another, so one process shows each refusal as every rank makes it.
TEST_CASE("pipeline_strategy refuses each bad option with its value and the fix") {
  const auto refused = [](const std::function<void(lf::PipelineOptions&)>& change) {
    lf::PipelineOptions options;
    change(options);
    try {
      lf::pipeline_strategy(options);
    } catch (const lf::ValueError& error) {
      return std::string(error.what());
    }
    return std::string("(nothing thrown)");
  };
  CHECK_THAT(refused([](auto& o) { o.pipeline_size = 0; }), Contains("pipeline_size=0 must be positive, or unset"));
  CHECK_THAT(refused([](auto& o) { o.data_parallel_size = -1; }), Contains("data_parallel_size=-1 must be positive"));
  CHECK_THAT(refused([](auto& o) { o.tensor_parallel_size = 0; }), Contains("tensor_parallel_size=0 must be positive"));
  CHECK_THAT(refused([](auto& o) { o.parallelize = nullptr; }), Contains("parallelize is empty"));
  CHECK_THAT(refused([](auto& o) { o.micro_batches = 0; }), Contains("micro_batches=0 must be positive"));
  CHECK_THAT(refused([](auto& o) { o.data_parallel_strategy = "zero"; }),
             Contains("data_parallel_strategy=\"zero\" is not valid") && Contains("\"fsdp\""));
  const auto fsdp = [](const std::function<void(lf::FSDPOptions&)>& change) {
    return [change](lf::PipelineOptions& o) {
      o.data_parallel_strategy = "fsdp";
      change(o.fully_sharded);
    };
  };
  CHECK_THAT(refused(fsdp([](auto& f) { f.sharding_strategy = lf::ShardingStrategy::HybridShard; })),
             Contains("HYBRID_SHARD needs a replica dimension"));
  CHECK_THAT(refused(fsdp([](auto& f) { f.auto_wrap_min_params = 100; })),
             Contains("fully_sharded.auto_wrap (or auto_wrap_min_params) makes sharding units inside a stage"));
  CHECK_THAT(refused(fsdp([](auto& f) { f.state_dict_type = "full"; })),
             Contains("state_dict_type=\"full\"") && Contains("consolidate"));
  CHECK_THAT(refused([](auto&) {}), Contains("(nothing thrown)"));
}

TEST_CASE("the pipeline strategy's mesh is refused before it forms") {
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy(lf::pipeline_strategy()), lf::env::map_env({}));
  CHECK_THROWS_WITH(fabric.strategy_as<lf::PipelineParallel>().device_mesh(),
                    Contains("mesh forms in setup_environment"));
}

TEST_CASE("lf::Pipeline splits its layers evenly, or where told, and refuses what cannot split") {
  torch::nn::Sequential layers;
  for (int i = 0; i < 8; ++i) layers->push_back(torch::nn::Linear(2, 2));
  const auto loss = [](const at::Tensor& out, const at::Tensor&) { return out.sum(); };
  lf::Pipeline even(layers, loss);
  CHECK(even->stage_starts(3) == std::vector<int64_t>{0, 3, 6});
  CHECK(even->stage_starts(8) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK_THROWS_WITH(even->stage_starts(9), Contains("8 layers cannot make 9 stages"));
  CHECK(even->named_parameters().contains("7.weight"));  // the Sequential's names
  lf::Pipeline told(layers, loss, std::vector<int64_t>{0, 1, 5});
  CHECK(told->stage_starts(3) == std::vector<int64_t>{0, 1, 5});
  CHECK_THROWS_WITH(told->stage_starts(2), Contains("stage_starts has 3 entries [0, 1, 5], but the pipeline runs 2"));
  CHECK_THROWS_WITH(lf::Pipeline(layers, loss, std::vector<int64_t>{1, 4}), Contains("stage_starts [1, 4] cannot split 8 layers"));
  CHECK_THROWS_WITH(lf::Pipeline(layers, nullptr), Contains("loss function is empty"));
  CHECK_THROWS_WITH(lf::Pipeline(torch::nn::Sequential(), loss), Contains("the Sequential has no layers"));
  // Without the pipeline strategy: the layers on the whole batch, then the loss.
  at::Tensor x = at::ones({4, 2});
  CHECK(even(x, x).item<double>() == Approx(layers->forward(x).sum().item<double>()));
}
