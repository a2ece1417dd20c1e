// lightning-run's command line, parsed in process: defaults, underscore spellings, pass-through,
// and usage errors that exit 2 naming the flag, the value and the choices.
#include <sstream>

#include "lightning/fabric/plugins/precision/precision.h"
#include "lightning/fabric/strategies/ddp.h"
#include "lightning/fabric/strategies/launchers/subprocess_launcher.h"
#include "lightning/fabric/utilities/launch_env.h"
#include "lightning/launcher/args.h"
#include "lightning/launcher/worker_env.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

using Catch::Matchers::Contains;
namespace lf = lightning::fabric;
namespace launcher = lightning::launcher;

namespace {
struct Parsed {
  launcher::ParsedCommandLine result;
  std::string out, err;
};
Parsed parse(std::vector<std::string> words) {
  words.insert(words.begin(), "lightning-run");
  std::vector<const char*> argv;
  for (const auto& word : words) argv.push_back(word.c_str());
  std::ostringstream out, err;
  Parsed parsed{launcher::parse_command_line(static_cast<int>(argv.size()), argv.data(), out, err), {}, {}};
  parsed.out = out.str();
  parsed.err = err.str();
  return parsed;
}
}  // namespace

TEST_CASE("args: Fabric's defaults", "[args]") {
  auto parsed = parse({"model", "./train"});
  REQUIRE_FALSE(parsed.result.exit_now);
  const auto& args = parsed.result.args;
  CHECK(args.devices == "1");
  CHECK(args.num_nodes == 1);
  CHECK(args.node_rank == 0);
  CHECK(args.main_address == "127.0.0.1");
  CHECK_FALSE(args.main_port);
  CHECK_FALSE(args.accelerator);
  CHECK_FALSE(args.strategy);
  CHECK_FALSE(args.precision);
  CHECK(args.max_restarts == 0);
  CHECK(args.node_timeout_s == 30);
  CHECK(args.binary == "./train");
  CHECK(args.binary_args.empty());
}

TEST_CASE("args: every flag, with underscore spellings, and pass-through after the binary", "[args]") {
  auto parsed = parse({"model", "--accelerator", "cpu", "--strategy", "ddp", "--devices", "3", "--num_nodes", "2",
                       "--node_rank", "1", "--main_address", "10.0.0.1", "--main-port", "1234", "--precision", "bf16",
                       "--max-restarts", "2", "--shutdown-grace", "1.5", "--rdzv-timeout", "9", "--node_timeout", "4.5", "--log-dir", "/tmp/x",
                       "--timestamp-output", "--local-ranks-filter", "0,2", "--tag-output", "--", "./train", "--devices",
                       "9", "--help"});
  REQUIRE_FALSE(parsed.result.exit_now);
  const auto& args = parsed.result.args;
  CHECK(*args.accelerator == "cpu");
  CHECK(*args.strategy == "ddp");
  CHECK(args.devices == "3");
  CHECK(args.num_nodes == 2);
  CHECK(args.node_rank == 1);
  CHECK(args.main_address == "10.0.0.1");
  CHECK(*args.main_port == 1234);
  CHECK(*args.precision == "bf16");
  CHECK(args.max_restarts == 2);
  CHECK(args.shutdown_grace_s == 1.5);
  CHECK(args.rdzv_timeout_s == 9);
  CHECK(args.node_timeout_s == 4.5);
  CHECK(*args.log_dir == "/tmp/x");
  CHECK(args.timestamp_output);
  CHECK(*args.local_ranks_filter == std::set<int>{0, 2});
  CHECK(*args.tag_output);
  CHECK(args.binary == "./train");
  CHECK(args.binary_args == std::vector<std::string>{"--devices", "9", "--help"});
}

TEST_CASE("args: --strategy, --precision and --accelerator choices come from the runtime's registries", "[args]") {
  // Not registered yet: refused, and the message says how a program's own strategy is chosen.
  CHECK(parse({"model", "--strategy", "launcher_test_ddp", "./train"}).result.exit_now == 2);
  lf::strategy_registry().add(
      "launcher_test_ddp", [](lf::StrategyContext context) { return std::make_shared<lf::DDPStrategy>(std::move(context)); },
      "a ddp registered by this test");
  auto accepted = parse({"model", "--strategy", "launcher_test_ddp", "./train"});
  CHECK(accepted.result.exit_now.has_value() == false);
  CHECK(*accepted.result.args.strategy == "launcher_test_ddp");
  auto help = parse({"model", "--help"});
  CHECK_THAT(help.out, Contains("launcher_test_ddp") && Contains("fsdp") && Contains("bf16-mixed") && Contains("gpu"));
  for (const auto& name : lf::precision_choices()) CHECK(parse({"model", "--precision", name, "./train"}).result.exit_now.has_value() == false);
  for (const auto& name : {"auto", "cpu"}) CHECK(parse({"model", "--accelerator", name, "./train"}).result.exit_now.has_value() == false);
}

TEST_CASE("args: bad values exit 2 and name the flag, the value and the choices", "[args]") {
  auto accelerator = parse({"model", "--accelerator", "tpu", "./train"});
  CHECK(accelerator.result.exit_now == 2);
  CHECK_THAT(accelerator.err, Contains("--accelerator=tpu") && Contains("auto, cpu, cuda, gpu"));
  auto strategy = parse({"model", "--strategy", "horovod", "./train"});
  CHECK(strategy.result.exit_now == 2);
  CHECK_THAT(strategy.err, Contains("--strategy=horovod") && Contains("ddp") && Contains("LT_STRATEGY"));
  auto precision = parse({"model", "--precision", "8", "./train"});
  CHECK_THAT(precision.err, Contains("--precision=8") && Contains("bf16-mixed"));
  auto devices = parse({"model", "--accelerator", "cpu", "--devices", "0", "./train"});
  CHECK(devices.result.exit_now == 2);
  CHECK_THAT(devices.err, Contains("devices=0"));
  auto node_rank = parse({"model", "--num-nodes", "2", "--node-rank", "2", "./train"});
  CHECK(node_rank.result.exit_now == 2);
  CHECK_THAT(node_rank.err, Contains("--node-rank=2 is out of range for --num-nodes=2"));
  auto no_binary = parse({"model", "--devices", "2"});
  CHECK(no_binary.result.exit_now == 2);
  CHECK_THAT(no_binary.err, Contains("needs the program to run"));
  auto unknown = parse({"model", "--bogus", "./train"});
  CHECK(unknown.result.exit_now == 2);
  auto filter = parse({"model", "--local-ranks-filter", "a", "./train"});
  CHECK_THAT(filter.err, Contains("--local-ranks-filter=a"));
  auto backend = parse({"model", "--process-group-backend", "mpi", "./train"});
  CHECK(backend.result.exit_now == 2);
  CHECK_THAT(backend.err, Contains("--process-group-backend=mpi") && Contains("gloo, nccl, shm, shm+gloo"));
  auto node_timeout = parse({"model", "--node-timeout", "0", "./train"});
  CHECK(node_timeout.result.exit_now == 2);
  CHECK_THAT(node_timeout.err, Contains("--node-timeout"));
  CHECK(parse({"launch", "./train"}).result.exit_now == 2);
  auto replicas = parse({"model", "--in-memory-replicas", "-1", "./train"});
  CHECK(replicas.result.exit_now == 2);
  CHECK_THAT(replicas.err, Contains("--in-memory-replicas"));
  CHECK(parse({"model", "--in-memory-replicas", "5", "./train"}).result.args.in_memory_replicas == 5);
  for (const std::string nodes : {"2", "1:2"}) {
    // Across nodes: each node's copies go to a buddy node.
    auto across = parse({"model", "--num-nodes", nodes, "--main-address", "10.0.0.1", "--in-memory-replicas", "1", "./train"});
    CHECK_FALSE(across.result.exit_now.has_value());
    CHECK(across.result.args.in_memory_replicas == 1);
  }
}

TEST_CASE("args: --num-nodes MIN:MAX (and --nnodes) makes the job elastic", "[args]") {
  auto fixed = parse({"model", "--num-nodes", "3", "./train"});
  REQUIRE_FALSE(fixed.result.exit_now.has_value());
  CHECK(fixed.result.args.num_nodes == 3);
  CHECK_FALSE(fixed.result.args.elastic.has_value());
  auto range = parse({"model", "--nnodes", "2:4", "--rdzv-last-call", "5", "./train"});
  REQUIRE_FALSE(range.result.exit_now.has_value());
  REQUIRE(range.result.args.elastic.has_value());
  CHECK(range.result.args.elastic->min == 2);
  CHECK(range.result.args.elastic->max == 4);
  CHECK(range.result.args.num_nodes == 4);
  CHECK(range.result.args.rdzv_last_call_s == 5);
  CHECK(parse({"model", "--num-nodes", "2:2", "./train"}).result.args.elastic.has_value());

  for (const std::string bad : {"3:2", "0:2", "2:", ":3", "a:b", "2:3:4", "0", "x"}) {
    auto parsed = parse({"model", "--num-nodes", bad, "./train"});
    CHECK(parsed.result.exit_now == 2);
    CHECK_THAT(parsed.err, Contains("--num-nodes=" + bad + " is not valid"));
  }
  CHECK_THAT(parse({"model", "--num-nodes", "3:2", "./train"}).err, Contains("MIN (3) exceeds MAX (2)"));
  auto node_rank = parse({"model", "--num-nodes", "2:3", "--node-rank", "1", "./train"});
  CHECK(node_rank.result.exit_now == 2);
  CHECK_THAT(node_rank.err, Contains("--node-rank=1 cannot be given with --num-nodes=2:3") && Contains("Leave --node-rank out"));
  auto last_call = parse({"model", "--num-nodes", "2", "--rdzv-last-call", "5", "./train"});
  CHECK(last_call.result.exit_now == 2);
  CHECK_THAT(last_call.err, Contains("--rdzv-last-call applies to elastic jobs only"));
}

TEST_CASE("args: torchrun's --numa-binding, --local-addr, --virtual-local-rank and --signals-to-handle", "[args]") {
  auto defaults = parse({"model", "./train"});
  REQUIRE_FALSE(defaults.result.exit_now);
  CHECK_FALSE(defaults.result.args.numa_binding);
  CHECK_FALSE(defaults.result.args.local_addr);
  CHECK_FALSE(defaults.result.args.virtual_local_rank);
  CHECK(defaults.result.args.signals_to_handle == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});  // torchrun's

  auto given = parse({"model", "--numa_binding", "core-complex", "--local-addr", "10.0.1.5", "--virtual_local_rank",
                      "--signals-to-handle", "SIGTERM, SIGUSR1,SIGTERM", "./train"});
  REQUIRE_FALSE(given.result.exit_now);
  CHECK(*given.result.args.numa_binding == "core-complex");
  CHECK(*given.result.args.local_addr == "10.0.1.5");
  CHECK(given.result.args.virtual_local_rank);
  CHECK(given.result.args.signals_to_handle == std::vector<int>{SIGTERM, SIGUSR1});

  auto numa = parse({"model", "--numa-binding", "l3", "./train"});
  CHECK(numa.result.exit_now == 2);
  CHECK_THAT(numa.err, Contains("--numa-binding=l3") && Contains("node, socket, exclusive, core-complex"));
  auto unknown = parse({"model", "--signals-to-handle", "SIGTERM,SIGFOO", "./train"});
  CHECK(unknown.result.exit_now == 2);
  CHECK_THAT(unknown.err, Contains("--signals-to-handle=SIGTERM,SIGFOO") && Contains("'SIGFOO'") &&
                              Contains("SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGALRM, SIGXCPU"));
  CHECK_THAT(parse({"model", "--signals-to-handle", "TERM", "./train"}).err, Contains("'TERM'"));
  auto none = parse({"model", "--signals-to-handle", ",", "./train"});
  CHECK(none.result.exit_now == 2);
  CHECK_THAT(none.err, Contains("names no signal"));
  auto blank = parse({"model", "--local-addr", " ", "./train"});
  CHECK(blank.result.exit_now == 2);
  CHECK_THAT(blank.err, Contains("--local-addr"));
  auto dp = parse({"model", "--virtual-local-rank", "--strategy", "dp", "./train"});
  CHECK(dp.result.exit_now == 2);
  CHECK_THAT(dp.err, Contains("--virtual-local-rank") && Contains("dp"));

  auto help = parse({"model", "--help"});
  CHECK_THAT(help.out, Contains("--numa-binding") && Contains("--local-addr") && Contains("--virtual-local-rank") &&
                           Contains("--signals-to-handle"));
}

TEST_CASE("args: --help and --version exit 0", "[args]") {
  auto help = parse({"model", "--help"});
  CHECK(help.result.exit_now == 0);
  CHECK_THAT(help.out, Contains("--devices") && Contains("--max-restarts"));
  // The usage says where the program goes, shows an example, and names consolidate.
  CHECK_THAT(help.out, Contains("lightning-run model [OPTIONS] BINARY [ARGS...]") &&
                           Contains("lightning-run model consolidate FOLDER") &&
                           Contains("lightning-run model --accelerator cpu --devices 2 build/bin/image_classifier"));
  auto top = parse({"--help"});
  CHECK(top.result.exit_now == 0);
  CHECK_THAT(top.out, Contains("lightning-run model [OPTIONS] BINARY [ARGS...]") &&
                          Contains("lightning-run model consolidate FOLDER") && Contains("Examples:"));
  auto misspelt = parse({"modle", "./train"});
  CHECK(misspelt.result.exit_now == 2);
  CHECK_THAT(misspelt.err, Contains("unknown command 'modle'") && Contains("model consolidate"));
  auto nothing = parse({});
  CHECK(nothing.result.exit_now == 2);
  CHECK_THAT(nothing.err, Contains("a command is required"));
  auto version = parse({"--version"});
  CHECK(version.result.exit_now == 0);
  CHECK_THAT(version.out, Contains("lightning-run"));
}

TEST_CASE("args: processes per node follow the accelerator and strategy", "[args]") {
  launcher::LaunchArgs args;
  args.accelerator = "cpu";
  args.devices = "4";
  CHECK(launcher::local_process_count(args) == 4);
  args.strategy = "dp";
  CHECK(launcher::local_process_count(args) == 1);
  args.strategy.reset();
  args.devices = "auto";
  CHECK(launcher::local_process_count(args) == 1);
}

TEST_CASE("worker environment: global ranks start at the node's offset", "[args]") {
  launcher::LaunchArgs args;
  launcher::NodeLayout layout;
  layout.node_rank = 1;
  layout.num_nodes = 2;
  layout.local_world_size = 1;
  layout.rank_offset = 2;
  layout.world_size = 3;
  layout.main_port = 4242;
  layout.run_id = "abc";
  layout.restart_count = 2;
  layout.attempt = 3;  // one regroup of an elastic job besides the two restarts
  auto env = launcher::worker_environment(args, layout, 0, {{"OMP_NUM_THREADS", "3"}}, "/tmp/e.json");
  CHECK(env.at("LT_ATTEMPT") == "3");
  CHECK(env.at("RANK") == "2");
  CHECK(env.at("LOCAL_RANK") == "0");
  CHECK(env.at("GROUP_RANK") == "1");
  CHECK(env.at("WORLD_SIZE") == "3");
  CHECK(env.at("MASTER_PORT") == "4242");
  CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == "2");
  CHECK(env.at("TORCHELASTIC_ERROR_FILE") == "/tmp/e.json");
  CHECK(env.at("OMP_NUM_THREADS") == "3");
  CHECK(env.count("LT_ACCELERATOR") == 0);
  CHECK(env.count("LT_PROCESS_GROUP_BACKEND") == 0);  // unset: the program's choice (shm or gloo on CPU)
  args.process_group_backend = "gloo";
  CHECK(launcher::worker_environment(args, layout, 0, {}, "/tmp/e.json").at("LT_PROCESS_GROUP_BACKEND") == "gloo");
}

TEST_CASE("worker environment: lightning-run and Fabric::launch() build it with one function", "[args]") {
  launcher::NodeLayout layout;
  layout.local_world_size = 2;
  layout.world_size = 2;
  layout.main_port = 4242;
  layout.run_id = "abc";
  const std::map<std::string, std::string> parent{{"PATH", "/bin"}, {"LT_HANG_TIMEOUT", "9"}};
  const std::string omp = std::to_string(lf::default_omp_threads(2));

  // lightning-run: its flags become LT_* variables; it hosts the store the workers join.
  launcher::LaunchArgs args;
  args.accelerator = "cpu";
  args.devices = "2";
  args.hang_timeout_s = 0.5;
  args.straggler_threshold_s = 0.25;
  args.check_collectives = true;
  const auto cli = launcher::worker_environment(args, layout, 1, parent, "/tmp/rank_1.error.json");
  CHECK(cli == lf::worker_environment(launcher::worker_settings(args, "/tmp/rank_1.error.json"), layout, 1, parent));
  CHECK(cli.at("LT_CLI_USED") == "1");
  CHECK(cli.at("LT_ACCELERATOR") == "cpu");
  CHECK(cli.count("LT_STRATEGY") == 0);
  CHECK(cli.at("LT_DEVICES") == "2");
  CHECK(cli.at("LT_NUM_NODES") == "1");
  CHECK(cli.at("LT_HANG_TIMEOUT") == "0.5");
  CHECK(cli.at("LT_STRAGGLER_THRESHOLD") == "0.25");
  CHECK(cli.at("LT_CHECK_COLLECTIVES") == "1");
  CHECK(cli.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
  CHECK(cli.at("TORCHELASTIC_ERROR_FILE") == "/tmp/rank_1.error.json");
  CHECK(cli.at("OMP_NUM_THREADS") == omp);

  // Fabric::launch(), a spawned rank: no CLI choices, the parent's settings pass through, rank 0
  // hosts the store, an error file in the launch's folder.
  const auto spawned =
      lf::worker_environment(lf::SubprocessLauncher::worker_settings(1, "/tmp/launch", true), layout, 1, parent);
  CHECK(spawned.count("LT_CLI_USED") == 0);
  CHECK(spawned.count("LT_DEVICES") == 0);
  CHECK(spawned.at("LT_HANG_TIMEOUT") == "9");
  CHECK(spawned.at("TORCHELASTIC_USE_AGENT_STORE") == "False");
  CHECK(spawned.at("TORCHELASTIC_ERROR_FILE") == "/tmp/launch/rank_1.error.json");
  CHECK(spawned.at("OMP_NUM_THREADS") == omp);
  CHECK(lf::worker_environment(lf::SubprocessLauncher::worker_settings(1, "/tmp/launch", false), layout, 1, parent)
            .count("OMP_NUM_THREADS") == 0);
  // The same torchrun set either way.
  std::map<std::string, std::string> torchrun;
  lf::add_torchrun_environment(torchrun, layout, 1);
  for (const auto& [name, value] : torchrun) {
    CHECK(cli.at(name) == value);
    CHECK(spawned.at(name) == value);
  }

  // Fabric::launch()'s own process, local rank 0: exactly the torchrun set and the store flag.
  std::map<std::string, std::string> own{{"TORCHELASTIC_USE_AGENT_STORE", "False"}};
  lf::add_torchrun_environment(own, layout, 0);
  CHECK(lf::worker_environment(lf::SubprocessLauncher::worker_settings(0, "/tmp/launch", true), layout, 0, {}) == own);
}

TEST_CASE("worker environment: --virtual-local-rank gives every worker LOCAL_RANK=0 and, on CUDA, its one GPU", "[args]") {
  launcher::NodeLayout layout;
  layout.local_world_size = 4;
  layout.world_size = 4;
  layout.run_id = "abc";
  launcher::LaunchArgs args;
  args.accelerator = "cpu";
  args.devices = "4";
  args.virtual_local_rank = true;
  // A CPU job: LOCAL_RANK=0 and the runtime's marker; its workers use no GPU, so CUDA_VISIBLE_DEVICES
  // is the parent's.
  const auto cpu = launcher::worker_environment(args, layout, 2, {{"CUDA_VISIBLE_DEVICES", "5"}}, "/tmp/e.json");
  CHECK(cpu.at("LOCAL_RANK") == "0");
  CHECK(cpu.at("RANK") == "2");
  CHECK(cpu.at("ROLE_RANK") == "2");
  CHECK(cpu.at("LOCAL_WORLD_SIZE") == "4");
  CHECK(cpu.at("LT_VIRTUAL_LOCAL_RANK") == "1");
  CHECK(cpu.at("CUDA_VISIBLE_DEVICES") == "5");
  args.virtual_local_rank = false;
  const auto plain = launcher::worker_environment(args, layout, 2, {}, "/tmp/e.json");
  CHECK(plain.at("LOCAL_RANK") == "2");
  CHECK(plain.count("LT_VIRTUAL_LOCAL_RANK") == 0);
  CHECK(plain.count("CUDA_VISIBLE_DEVICES") == 0);

  // A CUDA job of --devices 1,3,4,6 (lightning-run passes each local rank's GPU): each worker sees
  // its own, mapped through the parent's CUDA_VISIBLE_DEVICES as torchrun maps it.
  lf::WorkerSettings settings = launcher::worker_settings(args, "/tmp/e.json");
  settings.virtual_local_rank = true;
  settings.virtual_gpus = {1, 3, 4, 6};
  const auto unrestricted = lf::worker_environment(settings, layout, 1, {});
  CHECK(unrestricted.at("CUDA_VISIBLE_DEVICES") == "3");
  CHECK(unrestricted.at("LOCAL_RANK") == "0");
  CHECK(unrestricted.at("RANK") == "1");
  const std::map<std::string, std::string> parent{{"CUDA_VISIBLE_DEVICES", "7, 6,5,4,3,2,1,0"}};
  CHECK(lf::worker_environment(settings, layout, 0, parent).at("CUDA_VISIBLE_DEVICES") == "6");
  CHECK(lf::worker_environment(settings, layout, 1, parent).at("CUDA_VISIBLE_DEVICES") == "4");
  CHECK_THROWS_WITH(lf::worker_environment(settings, layout, 3, {{"CUDA_VISIBLE_DEVICES", "0,1"}}),
                    Contains("--virtual-local-rank") && Contains("GPU 6") && Contains("CUDA_VISIBLE_DEVICES=\"0,1\""));
}
