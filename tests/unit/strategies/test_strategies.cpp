// The strategies on their own, in one process: what each reports (ranks, devices, whether it
// averages gradients), what ParallelStrategy computes for the Lightning environment, and what a
// strategy refuses before its process group exists. Multi-process behaviour is tested by the
// ddp.*, fsdp.* and collectives.* jobs.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include "lightning/fabric/callbacks/ema.h"
#include "lightning/fabric/connector.h"
#include "lightning/fabric/strategies/composed.h"
#include "lightning/fabric/strategies/ddp.h"
#include "lightning/fabric/strategies/dp.h"
#include "lightning/fabric/strategies/fsdp.h"
#include "lightning/fabric/strategies/model_parallel.h"
#include "lightning/fabric/strategies/pipeline.h"

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

namespace {
std::shared_ptr<lf::Strategy> strategy_for(const lf::FabricOptions& options, std::map<std::string, std::string> env = {}) {
  return lf::Connector::build(options, lf::env::map_env(std::move(env))).strategy;
}
}  // namespace

TEST_CASE("strategies: single_device runs one process and its collectives return their input", "[strategies]") {
  auto strategy = strategy_for(lf::FabricOptions().accelerator("cpu").devices(1));
  CHECK(strategy->name() == "single_device");
  CHECK(strategy->world_size() == 1);
  CHECK(strategy->global_rank() == 0);
  CHECK(strategy->root_device() == torch::Device(torch::kCPU));
  CHECK_FALSE(strategy->averages_gradients());
  const auto tensor = torch::arange(3.0);
  CHECK(strategy->all_reduce(tensor, lf::ReduceOp::Sum).is_same(tensor));
  CHECK(strategy->all_gather(tensor).is_same(tensor));
  CHECK(strategy->broadcast_bytes("bytes", 0) == "bytes");
  CHECK(strategy->data_parallel_devices().empty());
}

TEST_CASE("strategies: ddp and fsdp place this process from the Lightning environment", "[strategies]") {
  const lf::FabricOptions two_by_two = lf::FabricOptions().accelerator("cpu").devices(2).num_nodes(2);
  for (const std::string name : {"ddp", "fsdp"}) {
    auto strategy = strategy_for(lf::FabricOptions(two_by_two).strategy(name), {{"NODE_RANK", "1"}, {"LOCAL_RANK", "1"}});
    auto& parallel = dynamic_cast<lf::ParallelStrategy&>(*strategy);
    CHECK(parallel.name() == name);
    CHECK(parallel.world_size() == 4);      // 2 devices x 2 nodes
    CHECK(parallel.global_rank() == 3);     // node 1's local rank 1
    CHECK(parallel.node_rank() == 1);
    CHECK(parallel.averages_gradients());   // backward refuses a loss from a model never set up
    CHECK(parallel.operation_count() == 0);
    CHECK_THROWS_WITH(parallel.collective(), Contains("The process group of strategy '" + name + "' does not exist yet"));
  }
}

TEST_CASE("strategies: a local rank outside the node's devices is named", "[strategies]") {
  auto strategy = strategy_for(lf::FabricOptions().accelerator("cpu").devices(2).strategy("ddp"), {{"LOCAL_RANK", "5"}});
  CHECK_THROWS_WITH(strategy->root_device(), Contains("LOCAL_RANK=5 is outside the 2 devices of this node"));
}

TEST_CASE("strategies: options reach the strategy whole, process-group settings included", "[strategies]") {
  lf::FSDPOptions options;
  options.sharding_strategy = lf::ShardingStrategy::ShardGradOp;
  options.process_group.hang_timeout = std::chrono::seconds(7);
  options.process_group.backend = lf::ProcessGroupBackend::Gloo;
  auto strategy = strategy_for(lf::FabricOptions().accelerator("cpu").devices(2).strategy(lf::fsdp_strategy(options)));
  auto& fsdp = dynamic_cast<lf::FSDPStrategy&>(*strategy);
  CHECK(fsdp.fsdp_options().sharding_strategy == lf::ShardingStrategy::ShardGradOp);
  CHECK(fsdp.process_group_settings().hang_timeout == std::chrono::seconds(7));
  CHECK(fsdp.process_group_settings().backend == lf::ProcessGroupBackend::Gloo);
  CHECK(fsdp.resident_bytes() == 0);  // nothing set up yet
}

TEST_CASE("strategies: dp is one process over CUDA devices and averages nothing across processes", "[strategies]") {
  lf::StrategyContext context;
  context.parallel_devices = {torch::Device(torch::kCUDA, 0), torch::Device(torch::kCUDA, 1)};
  lf::DataParallelStrategy dp(context);
  CHECK(dp.world_size() == 1);
  CHECK(dp.global_rank() == 0);
  CHECK(dp.root_device() == torch::Device(torch::kCUDA, 0));
  CHECK(dp.data_parallel_devices().size() == 2);
  CHECK_FALSE(dp.averages_gradients());
}

TEST_CASE("fsdp: the mixed-precision dtypes follow the precision plugin unless set, as Python's", "[strategies]") {
  const auto bf16 = lf::resolve_mixed_precision({}, "bf16-mixed");
  CHECK(bf16.param_dtype == at::kBFloat16);
  CHECK(bf16.reduce_dtype == at::kBFloat16);
  CHECK(bf16.buffer_dtype == at::kBFloat16);
  CHECK(lf::resolve_mixed_precision({}, "16-mixed").param_dtype == at::kHalf);
  CHECK(lf::resolve_mixed_precision({}, "bf16-true").buffer_dtype == at::kBFloat16);
  const auto fp32 = lf::resolve_mixed_precision({}, "32-true");
  CHECK_FALSE(fp32.param_dtype.has_value());  // no cast
  CHECK_FALSE(fp32.reduce_dtype.has_value());
  lf::FSDPMixedPrecision own;
  own.param_dtype = at::kHalf;
  own.reduce_dtype = at::kFloat;  // reduce in float32, compute in float16
  const auto mixed = lf::resolve_mixed_precision(own, "bf16-mixed");
  CHECK(mixed.param_dtype == at::kHalf);
  CHECK(mixed.reduce_dtype == at::kFloat);
  CHECK(mixed.buffer_dtype == at::kBFloat16);
  own.reduce_dtype.reset();
  CHECK(lf::resolve_mixed_precision(own, "32-true").reduce_dtype == at::kHalf);  // falls back to param_dtype
}

TEST_CASE("strategies: model_parallel picks its data dimension and refuses what cannot apply to it", "[strategies]") {
  lf::ModelParallelOptions options;
  options.tensor_parallel_size = 2;
  auto ddp = strategy_for(lf::FabricOptions().accelerator("cpu").devices(4).strategy(lf::model_parallel_strategy(options)));
  CHECK(dynamic_cast<lf::ComposedStrategy*>(ddp.get()) != nullptr);
  CHECK(dynamic_cast<lf::DDPStrategy*>(ddp->data_parallel_part()) != nullptr);
  CHECK(ddp->name() == "model_parallel");
  CHECK(ddp->sampler_share().replicas == 2);
  options.data_parallel_strategy = "fsdp";
  options.fully_sharded.sharding_strategy = lf::ShardingStrategy::ShardGradOp;
  auto fsdp = strategy_for(lf::FabricOptions().accelerator("cpu").devices(4).strategy(lf::model_parallel_strategy(options)));
  REQUIRE(dynamic_cast<lf::ComposedStrategy*>(fsdp.get()) != nullptr);
  auto* sharded = dynamic_cast<lf::FSDPStrategy*>(fsdp->data_parallel_part());
  REQUIRE(sharded != nullptr);
  CHECK(fsdp->name() == "model_parallel");
  CHECK(sharded->fsdp_options().sharding_strategy == lf::ShardingStrategy::ShardGradOp);
  CHECK(fsdp->sampler_share().replicas == 2);
  CHECK(dynamic_cast<lf::MeshStrategy*>(fsdp.get()) != nullptr);
  // lf::EMA averages every strategy's parts but the pipeline's (each stage's tensors on its ranks).
  auto pipeline = strategy_for(lf::FabricOptions().accelerator("cpu").devices(4).strategy(lf::pipeline_strategy()));
  lf::EMA ema;
  CHECK_THROWS_WITH(ema.follow(std::make_shared<torch::nn::LinearImpl>(2, 2), *pipeline),
                    Contains("strategy 'pipeline' keeps each pipeline stage's parameters on that stage's ranks") &&
                        Contains("Use lf::EMA with single_device, dp, ddp, fsdp or model_parallel"));
  options.data_parallel_shard_size = 2;  // HSDP's shard size, without HYBRID_SHARD
  CHECK_THROWS_WITH(lf::model_parallel_strategy(options),
                    Contains("data_parallel_shard_size=2 splits the data dimension into replicas of shards") &&
                        Contains("SHARD_GRAD_OP") && Contains("HYBRID_SHARD"));
  options.fully_sharded.sharding_strategy = lf::ShardingStrategy::HybridShard;  // HSDP x tensor: (replicate, shard, tensor)
  auto hybrid = strategy_for(lf::FabricOptions().accelerator("cpu").devices(8).strategy(lf::model_parallel_strategy(options)));
  CHECK(hybrid->sampler_share().replicas == 4);
  options.data_parallel_shard_size = 3;
  auto odd = strategy_for(lf::FabricOptions().accelerator("cpu").devices(8).strategy(lf::model_parallel_strategy(options)));
  CHECK_THROWS_WITH(odd->sampler_share(), Contains("HYBRID_SHARD shards each replica over 3 data ranks") &&
                                              Contains("does not divide the data size 4"));
  options.data_parallel_shard_size.reset();
  options.data_parallel_strategy = "zero";
  CHECK_THROWS_WITH(lf::model_parallel_strategy(options),
                    Contains("data_parallel_strategy=\"zero\" is not valid. Choose \"ddp\"") && Contains("\"fsdp\""));
}
