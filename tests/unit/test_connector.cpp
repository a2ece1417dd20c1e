// The Connector's rules (as Python Lightning Fabric's): LT_* overrides, the CLI conflict error, accelerator,
// precision and strategy resolution with their warnings and errors, plugins.

#include "lightning/fabric/connector.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/strategies/ddp.h"
#include "lightning/fabric/strategies/dp.h"
#include "lightning/fabric/strategies/fsdp.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;
using Env = std::map<std::string, std::string>;

namespace {
lf::ResolvedConfig resolve(const lf::FabricOptions& options, Env env = {}) {
  return lf::resolve_config(options, lf::env::map_env(std::move(env)));
}
const lf::FabricOptions kDefaults;
}  // namespace

TEST_CASE("defaults resolve to one CPU process in full precision", "[connector]") {
  auto config = resolve(kDefaults);
  CHECK(config.accelerator == "cpu");  // no GPU on this machine
  CHECK(config.strategy == "single_device");
  CHECK(config.device_indices == std::vector<int>{0});
  CHECK(config.num_nodes == 1);
  CHECK(config.precision == "32-true");
  CHECK(config.warnings.empty());
}

TEST_CASE("every LT_* variable overrides the code's value", "[connector]") {
  auto options = lf::FabricOptions().accelerator("cpu").devices(1).precision("32-true");
  auto config = resolve(options, {{"LT_ACCELERATOR", "cpu"},
                                  {"LT_DEVICES", "3"},
                                  {"LT_NUM_NODES", "2"},
                                  {"LT_PRECISION", "64-true"},
                                  {"LT_STRATEGY", "ddp"}});
  CHECK(config.device_indices.size() == 3);
  CHECK(config.num_nodes == 2);
  CHECK(config.world_size() == 6);
  CHECK(config.precision == "64-true");
  CHECK(config.strategy == "ddp");
}

TEST_CASE("outside the CLI the environment silently wins", "[connector]") {
  auto config = resolve(lf::FabricOptions().devices(1), {{"LT_DEVICES", "4"}});
  CHECK(config.device_indices.size() == 4);
  CHECK(config.strategy == "ddp");
}

TEST_CASE("under the CLI a code value that differs from default and flag is a conflict", "[connector]") {
  Env cli{{"LT_CLI_USED", "1"}, {"LT_DEVICES", "4"}, {"LT_NUM_NODES", "1"}};
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().devices(2), cli),
                    Contains("devices(2)") && Contains("--devices=4") && Contains("Remove one"));
  CHECK_THROWS_AS(resolve(lf::FabricOptions().devices(2), cli), lf::ValueError);
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().num_nodes(3), cli), Contains("--num-nodes=1"));
  Env precision_cli{{"LT_CLI_USED", "1"}, {"LT_PRECISION", "64-true"}};
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().precision("bf16-mixed"), precision_cli),
                    Contains("precision(bf16-mixed)") && Contains("--precision=64-true"));
  Env strategy_cli{{"LT_CLI_USED", "1"}, {"LT_STRATEGY", "ddp"}};
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().strategy("single_device"), strategy_cli), Contains("--strategy=ddp"));
  Env accel_cli{{"LT_CLI_USED", "1"}, {"LT_ACCELERATOR", "cpu"}};
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().accelerator("gpu"), accel_cli), Contains("--accelerator=cpu"));
}

TEST_CASE("under the CLI, defaults and equal values are no conflict", "[connector]") {
  Env cli{{"LT_CLI_USED", "1"}, {"LT_DEVICES", "2"}, {"LT_NUM_NODES", "1"}, {"LT_ACCELERATOR", "cpu"}};
  CHECK(resolve(kDefaults, cli).device_indices.size() == 2);
  CHECK(resolve(lf::FabricOptions().devices(2).accelerator("cpu"), cli).device_indices.size() == 2);
  CHECK(resolve(lf::FabricOptions().devices("2"), cli).device_indices.size() == 2);
  // The documented default written out in code is no conflict either (Python raises here).
  Env precision_cli{{"LT_CLI_USED", "1"}, {"LT_PRECISION", "bf16-mixed"}};
  CHECK(resolve(lf::FabricOptions().precision("32-true"), precision_cli).precision == "bf16-mixed");
  CHECK(resolve(lf::FabricOptions().precision("32"), precision_cli).precision == "bf16-mixed");
  CHECK(resolve(lf::FabricOptions().precision("32-true"), {}).precision == "32-true");
}

TEST_CASE("accelerator names: auto, cpu, gpu/cuda without a GPU, invalid", "[connector]") {
  CHECK(resolve(lf::FabricOptions().accelerator("auto")).accelerator == "cpu");
  CHECK(resolve(lf::FabricOptions().accelerator("cpu")).accelerator == "cpu");
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().accelerator("gpu")), Contains("needs a CUDA GPU"));
  CHECK_THROWS_AS(resolve(lf::FabricOptions().accelerator("cuda")), lf::RuntimeError);
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().accelerator("tpu")), Contains("accelerator=\"tpu\"") && Contains("cpu"));
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().accelerator("fpga")),
                    Contains("accelerator=\"fpga\"") && Contains("auto, cpu, cuda, gpu"));
}

TEST_CASE("precision strings, aliases and their warnings", "[connector]") {
  for (const std::string canonical : {"64-true", "32-true", "bf16-mixed", "16-true", "bf16-true"}) {
    auto config = resolve(lf::FabricOptions().precision(canonical));
    CHECK(config.precision == canonical);
    CHECK(config.warnings.empty());
  }
  CHECK(resolve(lf::FabricOptions().precision("64")).precision == "64-true");
  CHECK(resolve(lf::FabricOptions().precision("32")).precision == "32-true");
  auto bf16 = resolve(lf::FabricOptions().precision("bf16"));
  CHECK(bf16.precision == "bf16-mixed");
  REQUIRE(bf16.warnings.size() == 1);
  CHECK_THAT(bf16.warnings[0], Contains("discouraged") && Contains("bf16-mixed"));
  auto sixteen = resolve(lf::FabricOptions().precision("16"));  // 16 -> 16-mixed -> bf16-mixed on CPU
  CHECK(sixteen.precision == "bf16-mixed");
  CHECK(sixteen.warnings.size() == 2);
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().precision("8-true")),
                    Contains("precision=\"8-true\"") && Contains("64-true, 32-true, 16-mixed"));
}

TEST_CASE("16-mixed on CPU falls back to bf16-mixed with a warning", "[connector]") {
  auto config = resolve(lf::FabricOptions().precision("16-mixed"));
  CHECK(config.precision == "bf16-mixed");
  REQUIRE(config.warnings.size() == 1);
  CHECK_THAT(config.warnings[0], Contains("bf16-mixed"));
}

TEST_CASE("strategy auto, dp fallback, single_device limits and invalid names", "[connector]") {
  CHECK(resolve(lf::FabricOptions().devices(1)).strategy == "single_device");
  CHECK(resolve(lf::FabricOptions().devices(2)).strategy == "ddp");
  CHECK(resolve(lf::FabricOptions().num_nodes(2)).strategy == "ddp");
  auto dp = resolve(lf::FabricOptions().strategy("dp").devices(2));
  CHECK(dp.strategy == "ddp");
  CHECK_THAT(dp.warnings.at(0), Contains("\"dp\" is not supported on CPU"));
  CHECK(resolve(lf::FabricOptions().strategy("ddp").devices(1)).strategy == "ddp");
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().strategy("single_device").devices(2)),
                    Contains("single_device") && Contains("devices=2"));
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().strategy("deepspeed")), Contains("only in Python"));
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().strategy("horovod")),
                    Contains("strategy=\"horovod\"") && Contains("ddp") && Contains("fsdp"));
  // Any case, as Python's connector lowers the name (in code and from LT_STRATEGY).
  CHECK(resolve(lf::FabricOptions().strategy("DDP").devices(2)).strategy == "ddp");
  CHECK(resolve(lf::FabricOptions().devices(2), {{"LT_STRATEGY", "Fsdp"}}).strategy == "fsdp");
  // model_parallel refuses the precisions Python's refuses, 16-mixed even where CPU would fall back.
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().strategy("model_parallel").devices(2).precision("16-mixed")),
                    Contains("precision=\"16-mixed\"") && Contains("bf16-mixed"));
  CHECK(resolve(lf::FabricOptions().strategy("model_parallel").devices(2).precision("bf16-mixed")).strategy ==
        "model_parallel");
}

TEST_CASE("num_nodes must be a positive integer", "[connector]") {
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().num_nodes(0)), Contains("num_nodes=0"));
  CHECK_THROWS_WITH(resolve(kDefaults, {{"LT_NUM_NODES", "two"}}), Contains("num_nodes=two"));
}

TEST_CASE("invalid devices from the environment are reported", "[connector]") {
  CHECK_THROWS_WITH(resolve(kDefaults, {{"LT_DEVICES", "0"}}), Contains("devices=0"));
  CHECK_THROWS_WITH(resolve(kDefaults, {{"LT_DEVICES", "0,1"}}), Contains("devices=0,1"));
}

TEST_CASE("build instantiates the resolved parts", "[connector]") {
  auto connector = lf::Connector::build(lf::FabricOptions().precision("64"), lf::env::map_env({}));
  CHECK(connector.accelerator->name() == "cpu");
  CHECK(connector.strategy->name() == "single_device");
  CHECK(connector.precision->name() == "64-true");
  CHECK(connector.cluster_environment->name() == "lightning");
  CHECK(connector.strategy->root_device() == torch::Device(torch::kCPU));
}

TEST_CASE("a precision plugin replaces the precision flag, both together is an error", "[connector]") {
  auto plugin = std::make_shared<lf::DoublePrecision>();
  auto connector = lf::Connector::build(lf::FabricOptions().plugin(plugin), lf::env::map_env({}));
  CHECK(connector.precision == plugin);
  CHECK_THROWS_WITH(lf::Connector::build(lf::FabricOptions().plugin(plugin).precision("32-true"), lf::env::map_env({})),
                    Contains("both precision"));
  CHECK_THROWS_WITH(
      lf::Connector::build(lf::FabricOptions().plugin(plugin).plugin(std::make_shared<lf::Precision>()), lf::env::map_env({})),
      Contains("2 precision plugins"));
  // Duplicates of two kinds are named together, as Python's connector names them.
  auto slurm = std::make_shared<lf::SLURMEnvironment>(lf::env::map_env({}));
  CHECK_THROWS_WITH(lf::Connector::build(lf::FabricOptions()
                                             .plugin(plugin)
                                             .plugin(std::make_shared<lf::Precision>())
                                             .plugin(slurm)
                                             .plugin(std::make_shared<lf::LightningEnvironment>(lf::env::map_env({}))),
                                         lf::env::map_env({})),
                    Contains("2 precision plugins") && Contains("2 cluster environment plugins"));
}

TEST_CASE("torchrun-style variables select the torchelastic environment", "[connector]") {
  Env torchrun{{"TORCHELASTIC_RUN_ID", "job"}, {"RANK", "0"}, {"GROUP_RANK", "0"}, {"LOCAL_RANK", "0"},
               {"LOCAL_WORLD_SIZE", "1"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto connector = lf::Connector::build(kDefaults, lf::env::map_env(torchrun));
  CHECK(connector.cluster_environment->name() == "torchelastic");
  CHECK(connector.cluster_environment->creates_processes_externally());
  CHECK(connector.cluster_environment->main_port() == 29500);
  torchrun["LOCAL_WORLD_SIZE"] = "2";
  CHECK_THROWS_WITH(lf::Connector::build(lf::FabricOptions().devices(1), lf::env::map_env(torchrun)),
                    Contains("LOCAL_WORLD_SIZE=2") && Contains("devices=1"));
}

TEST_CASE("devices auto is the number of processes an external launcher started on this node", "[connector]") {
  Env torchrun{{"TORCHELASTIC_RUN_ID", "job"}, {"RANK", "1"}, {"GROUP_RANK", "0"}, {"LOCAL_RANK", "1"},
               {"LOCAL_WORLD_SIZE", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto config = resolve(kDefaults, torchrun);
  CHECK(config.num_processes_per_node() == 2);
  CHECK(config.strategy == "ddp");
  Env mpi{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}};
  CHECK(resolve(kDefaults, mpi).num_processes_per_node() == 3);
  Env slurm{{"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}, {"SLURM_JOB_NAME", "interactive"}, {"SLURM_PROCID", "0"},
            {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "4(x1)"}};
  CHECK(resolve(kDefaults, slurm).num_processes_per_node() == 4);
  CHECK(resolve(kDefaults, {}).num_processes_per_node() == 1);  // not launched: one CPU process
  CHECK(resolve(lf::FabricOptions().devices(2), torchrun).num_processes_per_node() == 2);  // explicit stays
  CHECK(resolve(lf::FabricOptions().devices("auto"), torchrun).num_processes_per_node() == 2);  // the default, written
}

TEST_CASE("an unset num_nodes follows the launcher and an explicit one that disagrees is an error", "[connector]") {
  // One rank of a 2-node srun step with 1 task per node: without num_nodes it must be ddp over 2.
  Env slurm{{"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "0"},
            {"SLURM_NODEID", "1"}, {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}, {"SLURM_STEP_NUM_NODES", "2"},
            {"SLURM_STEP_NODELIST", "n[1-2]"}, {"SLURM_JOB_ID", "9"}};
  auto connector = lf::Connector::build(lf::FabricOptions().accelerator("cpu"), lf::env::map_env(slurm));
  CHECK(connector.config.num_nodes == 2);
  CHECK(connector.config.strategy == "ddp");
  CHECK_THROWS_WITH(lf::Connector::build(lf::FabricOptions().accelerator("cpu").num_nodes(1), lf::env::map_env(slurm)),
                    Contains("num_nodes=1") && Contains("spans 2 nodes") && Contains("SLURM_STEP_NUM_NODES=2"));
  CHECK_THROWS_WITH(lf::Connector::build(lf::FabricOptions().accelerator("cpu").devices(2), lf::env::map_env(slurm)),
                    Contains("devices=2") && Contains("started 1 processes"));
}

TEST_CASE("never single_device while the launcher started several processes", "[connector]") {
  // PMI without MPI_LOCALNRANKS: no count per node, so devices "auto" is 1, but the world is 2.
  Env mpi{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}};
  CHECK(lf::Connector::build(lf::FabricOptions().accelerator("cpu"), lf::env::map_env(mpi)).config.strategy == "ddp");
  CHECK_THROWS_WITH(
      lf::Connector::build(lf::FabricOptions().accelerator("cpu").strategy("single_device"), lf::env::map_env(mpi)),
      Contains("single_device") && Contains("one of 2"));
}

namespace {
// A user strategy registered by name: the registry is the extension point.
class EchoStrategy : public lf::SingleDeviceStrategy {
 public:
  using SingleDeviceStrategy::SingleDeviceStrategy;
  std::string name() const override { return "echo"; }
};
}  // namespace

TEST_CASE("a strategy registered by the user is accepted by name", "[connector]") {
  lf::strategy_registry().add(
      "echo", [](lf::StrategyContext context) { return std::make_shared<EchoStrategy>(std::move(context)); },
      "test strategy", /*override_existing=*/true);
  auto connector = lf::Connector::build(lf::FabricOptions().strategy("echo"), lf::env::map_env({}));
  CHECK(connector.strategy->name() == "echo");
  CHECK_THROWS_WITH(lf::strategy_registry().add("echo", nullptr), Contains("already registered"));
  CHECK_THROWS_WITH(lf::strategy_registry().create("nope", lf::StrategyContext{}),
                    Contains("'nope'") && Contains("echo") && Contains("single_device"));
}

TEST_CASE("ddp_fork is not offered, and naming it gives the reason and the alternative", "[connector]") {
  CHECK_THROWS_WITH(lf::Connector::build(lf::FabricOptions().strategy("ddp_fork").devices(2), lf::env::map_env({})),
                    Contains("ddp_fork") && Contains("strategy=\"ddp\""));
  const auto choices = lf::strategy_choices();
  CHECK(std::find(choices.begin(), choices.end(), "ddp_fork") == choices.end());
  CHECK_FALSE(lf::strategy_registry().contains("ddp_fork"));
}

TEST_CASE("a strategy with settings: ddp_strategy(DDPOptions) reaches the DDP strategy", "[connector][ddp]") {
  lf::DDPOptions settings;
  settings.bucket_cap_mb = 50;
  settings.first_bucket_mb = 2;
  settings.process_group.timeout = std::chrono::seconds(90);
  settings.process_group.backend = lf::ProcessGroupBackend::Gloo;
  auto connector = lf::Connector::build(
      lf::FabricOptions().accelerator("cpu").devices(2).strategy(lf::ddp_strategy(settings)), lf::env::map_env({}));
  CHECK(connector.config.strategy == "ddp");
  auto& ddp = dynamic_cast<lf::DDPStrategy&>(*connector.strategy);
  CHECK(ddp.options().bucket_cap_mb == 50);
  CHECK(ddp.options().first_bucket_mb == 2);
  CHECK(ddp.options().process_group.timeout == std::chrono::seconds(90));
  CHECK(ddp.process_group_settings().backend == lf::ProcessGroupBackend::Gloo);

  // The name of a configured strategy is valid even outside the registry.
  settings.name = "ddp_tuned";
  auto tuned = lf::Connector::build(
      lf::FabricOptions().accelerator("cpu").devices(2).strategy(lf::ddp_strategy(settings)), lf::env::map_env({}));
  CHECK(tuned.strategy->name() == "ddp_tuned");

  // lightning-run --strategy naming another strategy replaces it, and says the settings are unused.
  auto replaced = lf::Connector::build(lf::FabricOptions().accelerator("cpu").devices(2).strategy(lf::ddp_strategy(settings)),
                                       lf::env::map_env({{"LT_STRATEGY", "ddp_spawn"}}));
  CHECK(replaced.strategy->name() == "ddp_spawn");
  CHECK(dynamic_cast<lf::DDPStrategy&>(*replaced.strategy).options().bucket_cap_mb == 25);
  REQUIRE(replaced.config.warnings.size() == 1);
  CHECK_THAT(replaced.config.warnings[0], Contains("ddp_tuned") && Contains("unused"));
}

TEST_CASE("ddp_strategy refuses bad settings", "[connector][ddp][errors]") {
  lf::DDPOptions bad;
  bad.bucket_cap_mb = 0;
  CHECK_THROWS_WITH(lf::ddp_strategy(bad), Contains("bucket_cap_mb=0") && Contains("positive"));
  bad = {};
  bad.process_group.timeout = std::chrono::milliseconds(0);
  CHECK_THROWS_WITH(lf::ddp_strategy(bad), Contains("DDPOptions: process_group.timeout=0"));
  bad = {};
  bad.process_group.backend = lf::ProcessGroupBackend::Shm;
  CHECK_NOTHROW(lf::ddp_strategy(bad));
  lf::FSDPOptions fsdp;
  fsdp.process_group.hang_timeout = std::chrono::milliseconds(-5);
  CHECK_THROWS_WITH(lf::fsdp_strategy(fsdp), Contains("FSDPOptions: process_group.hang_timeout=-5"));
}

TEST_CASE("dp: single process over CUDA devices, refused on CPU devices", "[connector][dp]") {
  lf::StrategyContext context;
  context.parallel_devices = {torch::Device(torch::kCPU), torch::Device(torch::kCPU)};
  CHECK_THROWS_WITH(lf::DataParallelStrategy(context), Contains("strategy=\"dp\"") && Contains("cpu"));
  context.parallel_devices = {torch::Device(torch::kCUDA, 0), torch::Device(torch::kCUDA, 1)};
  lf::DataParallelStrategy dp(context);
  CHECK(dp.world_size() == 1);
  CHECK(dp.root_device() == torch::Device(torch::kCUDA, 0));
  CHECK(dp.data_parallel_devices().size() == 2);
  CHECK(lf::strategy_registry().contains("dp"));
  context.num_nodes = 2;
  CHECK_THROWS_WITH(lf::DataParallelStrategy(context), Contains("num_nodes=2"));
}

TEST_CASE("fsdp_cpu_offload is fsdp on CPU devices and refused with CUDA devices", "[connector][fsdp]") {
  auto connector = lf::Connector::build(lf::FabricOptions().accelerator("cpu").devices(2).strategy("fsdp_cpu_offload"),
                                        lf::env::map_env({}));
  CHECK(dynamic_cast<lf::FSDPStrategy*>(connector.strategy.get()) != nullptr);
  lf::StrategyContext context;
  context.parallel_devices = {torch::Device(torch::kCUDA, 0)};
  CHECK_THROWS_WITH(lf::strategy_registry().create("fsdp_cpu_offload", context),
                    Contains("fsdp_cpu_offload") && Contains("use strategy=\"fsdp\""));
}

TEST_CASE("every list of names comes from the registries, in registration order", "[connector][registry]") {
  const auto strategies = lf::strategy_choices();
  REQUIRE(strategies.front() == "auto");
  CHECK(std::vector<std::string>(strategies.begin() + 1, strategies.end()) == lf::strategy_registry().names());
  CHECK(std::vector<std::string>(strategies.begin() + 1, strategies.begin() + 3) ==
        std::vector<std::string>{"single_device", "ddp"});
  lf::strategy_registry().add(
      "listed", [](lf::StrategyContext context) { return std::make_shared<EchoStrategy>(std::move(context)); },
      "test strategy", /*override_existing=*/true);
  CHECK(lf::strategy_choices().back() == "listed");
  CHECK_THROWS_WITH(resolve(lf::FabricOptions().strategy("nope")), Contains("listed") && Contains("fsdp_cpu_offload"));
  const auto precisions = lf::precision_choices();
  const auto& registered = lf::precision_registry().names();
  CHECK(std::vector<std::string>(precisions.begin(), precisions.begin() + registered.size()) == registered);
  CHECK(std::vector<std::string>(precisions.end() - 4, precisions.end()) == std::vector<std::string>{"64", "32", "16", "bf16"});
}

TEST_CASE("ddp and fsdp are siblings under ParallelStrategy, each with its own process-group settings", "[connector][fsdp]") {
  lf::FSDPOptions fsdp;
  fsdp.process_group.backend = lf::ProcessGroupBackend::Gloo;
  fsdp.process_group.timeout = std::chrono::seconds(42);
  auto connector = lf::Connector::build(lf::FabricOptions().accelerator("cpu").devices(2).strategy(lf::fsdp_strategy(fsdp)),
                                        lf::env::map_env({}));
  auto* parallel = dynamic_cast<lf::ParallelStrategy*>(connector.strategy.get());
  REQUIRE(parallel != nullptr);
  CHECK(dynamic_cast<lf::DDPStrategy*>(connector.strategy.get()) == nullptr);
  CHECK(std::is_base_of_v<lf::ParallelStrategy, lf::DDPStrategy>);
  CHECK_FALSE(std::is_base_of_v<lf::ParallelStrategy, lf::DataParallelStrategy>);  // one process
  CHECK_FALSE(std::is_base_of_v<lf::DDPStrategy, lf::FSDPStrategy>);
  CHECK(parallel->process_group_settings().backend == lf::ProcessGroupBackend::Gloo);
  CHECK(parallel->process_group_settings().timeout == std::chrono::seconds(42));
  fsdp.process_group.timeout = std::chrono::milliseconds(0);
  CHECK_THROWS_WITH(lf::fsdp_strategy(fsdp), Contains("FSDPOptions: process_group.timeout=0"));
  fsdp = {};
  fsdp.process_group.rendezvous_timeout = std::chrono::milliseconds(-1);
  CHECK_THROWS_WITH(lf::fsdp_strategy(fsdp), Contains("FSDPOptions: process_group.rendezvous_timeout=-1"));
}
