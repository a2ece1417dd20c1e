#include "lightning/fabric/connector.h"

#include <algorithm>
#include <cctype>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/utilities/rank_zero.h"

namespace lightning::fabric {
namespace {

bool cli_used(const env::EnvLookup& env) { return env::Reader(env).flag(env::kCliUsed); }

// Python's _argument_from_env: the LT_<NAME> value wins over the code's; under the CLI a code
// value that is neither the default nor the CLI's value is a conflict.
std::string from_env(const env::EnvLookup& env, const char* variable, const std::string& option,
                     const std::string& flag, const std::string& code_value, const std::string& default_value) {
  auto env_value = env(variable);
  if (!env_value) return code_value;
  LF_CHECK(!(cli_used(env) && *env_value != code_value && code_value != default_value), ValueError,
           "Your code sets FabricOptions().", option, "(", code_value, ") but lightning-run was given --", flag,
           "=", *env_value, " (", variable, "). Remove one of them: either the option in code or the flag on "
           "the command line.");
  return *env_value;
}

std::string choices_with(const std::vector<std::string>& base, const std::vector<std::string>& registered) {
  std::vector<std::string> all = base;
  for (const auto& name : registered) {
    if (std::find(all.begin(), all.end(), name) == all.end()) all.push_back(name);
  }
  return join_names(all);
}

std::string resolve_precision(const std::string& value, std::vector<std::string>& warnings) {
  if (value == "16" || value == "bf16") {
    warnings.push_back("precision=\"" + value + "\" is accepted for compatibility but discouraged: write \"" +
                       value + "-mixed\" instead.");
    return value + "-mixed";
  }
  if (value == "32" || value == "64") return value + "-true";
  const auto& choices = precision_choices();
  const bool known = std::find(choices.begin(), choices.end(), value) != choices.end();
  LF_CHECK(known || precision_registry().contains(value), ValueError, "precision=\"", value,
           "\" is not valid. Choose one of: ", choices_with(choices, precision_registry().names()), ".");
  return value;
}

int resolve_num_nodes(const std::string& value) {
  int parsed = 0;
  try {
    size_t used = 0;
    parsed = std::stoi(value, &used);
    if (used != value.size()) parsed = 0;
  } catch (const std::exception&) {
    parsed = 0;
  }
  LF_CHECK(parsed > 0, ValueError, "num_nodes=", value, " is not valid: it must be an int >= 1.");
  return parsed;
}

// Strategy names in any case, as Python's connector lowers them ("DDP" is "ddp"); a name that
// is a strategy as written (a registered or configured one with capitals) stays as it is.
std::string strategy_name_in_any_case(const std::string& value, const FabricOptions& options) {
  const auto& choices = strategy_choices();
  const bool as_written = std::find(choices.begin(), choices.end(), value) != choices.end() ||
                          strategy_registry().contains(value) ||
                          (options.strategy_spec() && options.strategy_spec()->name == value);
  if (as_written) return value;
  std::string lower = value;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower;
}

// configured: the value names a StrategySpec given in code (which needs no registry entry).
std::string resolve_strategy(const std::string& value, bool configured, const ResolvedConfig& config,
                             std::vector<std::string>& warnings) {
  LF_CHECK(value.rfind("deepspeed", 0) != 0 && value.rfind("xla", 0) != 0, ValueError, "strategy=\"", value,
           "\" exists only in Python Lightning. Choose one of: ",
           choices_with(strategy_choices(), strategy_registry().names()), ".");
  // Python's fork-started ddp is not offered: forking a process after LibTorch has started its
  // thread pools (intra-op, autograd, gloo) can deadlock the child.
  LF_CHECK(value != "ddp_fork" && value != "ddp_notebook", ValueError, "strategy=\"", value, "\" is not "
           "offered: it forks the worker processes, and forking after LibTorch has started its thread pools "
           "(intra-op, autograd, gloo) can deadlock the child. Use strategy=\"ddp\", which starts each process "
           "by re-executing the program.");
  const auto& choices = strategy_choices();
  const bool known = std::find(choices.begin(), choices.end(), value) != choices.end();
  LF_CHECK(known || configured || strategy_registry().contains(value), ValueError, "strategy=\"", value,
           "\" is not valid. Choose one of: ", choices_with(choices, strategy_registry().names()), ".");
  if (value == "auto") {
    const bool several = config.num_nodes > 1 || config.num_processes_per_node() > 1 || config.launched_world_size > 1;
    return several ? "ddp" : "single_device";
  }
  if (value == "dp" && config.accelerator == "cpu") {
    warnings.push_back("strategy=\"dp\" is not supported on CPU: using strategy=\"ddp\" instead.");
    return "ddp";
  }
  LF_CHECK(!(value == "single_device" && (config.num_processes_per_node() > 1 || config.num_nodes > 1)),
           ValueError, "strategy=\"single_device\" runs one process, but devices=", config.num_processes_per_node(),
           " and num_nodes=", config.num_nodes, " ask for more. Use devices=1, num_nodes=1, or strategy=\"ddp\".");
  return value;
}

// The names of the plugins of type T among plugins.
template <class T>
std::vector<std::string> plugin_names(const std::vector<std::shared_ptr<Plugin>>& plugins) {
  std::vector<std::string> names;
  for (const auto& plugin : plugins) {
    if (std::dynamic_pointer_cast<T>(plugin)) names.push_back("'" + plugin->name() + "'");
  }
  return names;
}

// One error naming every kind given more than once (as Python's connector lists them all).
void refuse_duplicate_plugins(const std::vector<std::shared_ptr<Plugin>>& plugins) {
  std::string duplicates;
  const auto add = [&](const char* kind, const std::vector<std::string>& names) {
    if (names.size() < 2) return;
    duplicates += (duplicates.empty() ? "" : " and ") + std::to_string(names.size()) + " " + kind + " plugins (" +
                  join_names(names) + ")";
  };
  add("precision", plugin_names<Precision>(plugins));
  add("cluster environment", plugin_names<ClusterEnvironment>(plugins));
  LF_CHECK(duplicates.empty(), ValueError, "FabricOptions().plugins() holds ", duplicates,
           ". Pass at most one of each kind.");
}

template <class T>
std::shared_ptr<T> single_plugin(const std::vector<std::shared_ptr<Plugin>>& plugins) {
  for (const auto& plugin : plugins) {
    if (auto typed = std::dynamic_pointer_cast<T>(plugin)) return typed;  // refuse_duplicate_plugins ran first
  }
  return nullptr;
}

// The cluster environment given as a plugin, else the one the variables describe.
std::shared_ptr<ClusterEnvironment> cluster_environment_for(const FabricOptions& options, const env::EnvLookup& env) {
  auto plugin = single_plugin<ClusterEnvironment>(options.plugins());
  return plugin ? plugin : detect_cluster_environment(env);
}

}  // namespace

ResolvedConfig resolve_config(const FabricOptions& options, const env::EnvLookup& env) {
  refuse_duplicate_plugins(options.plugins());
  ResolvedConfig config;
  const std::string accelerator =
      from_env(env, env::kAccelerator, "accelerator", "accelerator", options.accelerator(), "auto");
  const std::string strategy = strategy_name_in_any_case(
      from_env(env, env::kStrategy, "strategy", "strategy", options.strategy(), "auto"), options);
  const std::string devices =
      from_env(env, env::kDevices, "devices", "devices", options.devices().to_string(), "auto");
  std::string num_nodes =
      from_env(env, env::kNumNodes, "num_nodes", "num-nodes", std::to_string(options.num_nodes()), "1");
  // precision("32-true") written in code is the documented default: no conflict with a flag.
  const std::string code_precision = options.precision().value_or("");
  const bool default_precision = code_precision == "32-true" || code_precision == "32";
  const std::string precision =
      from_env(env, env::kPrecision, "precision", "precision", default_precision ? "" : code_precision, "");

  config.precision = resolve_precision(precision.empty() ? "32-true" : precision, config.warnings);
  config.accelerator = resolve_accelerator(accelerator);
  // The code's own DevicesSpec keeps its form (a list stays a list) unless the environment replaced it.
  DevicesSpec spec = devices == options.devices().to_string() ? options.devices() : DevicesSpec(devices);
  // Under torchrun, srun or mpirun, devices "auto" is the number of processes the launcher started
  // here, and an unset num_nodes is the number of nodes its job spans.
  const auto environment = cluster_environment_for(options, env);
  if (devices == "auto") {
    if (auto launched = environment->launched_processes_per_node()) spec = DevicesSpec(*launched);
  }
  if (!options.num_nodes_given() && !env(env::kNumNodes)) {
    if (auto nodes = environment->launched_num_nodes()) num_nodes = std::to_string(*nodes);
  }
  if (environment->creates_processes_externally()) {
    try {
      config.launched_world_size = environment->world_size();
    } catch (const std::exception&) {
      // a missing rank variable is reported where the strategy needs it, with its own message
    }
  }
  if (config.accelerator == "cuda" && env::Reader(env).flag(env::kVirtualLocalRank)) {
    // lightning-run --virtual-local-rank: CUDA_VISIBLE_DEVICES holds this process's one GPU, its
    // device 0, and LOCAL_RANK is 0 in every worker. The node still runs LOCAL_WORLD_SIZE
    // processes (meshes and hybrid sharding count them), each on its own device 0.
    const int processes = environment->launched_processes_per_node().value_or(1);
    LF_CHECK(processes >= 1, ValueError, env::kVirtualLocalRank, "=1 needs LOCAL_WORLD_SIZE >= 1, got ", processes, ".");
    config.device_indices.assign(static_cast<size_t>(processes), 0);
  } else {
    config.device_indices = accelerator_registry().create(config.accelerator)->parse_devices(spec);
  }
  config.num_nodes = resolve_num_nodes(num_nodes);
  const std::string asked_precision = config.precision;
  if (config.precision == "16-mixed" && config.accelerator == "cpu") {
    config.warnings.push_back("precision=\"16-mixed\" is not supported on CPU (as in Python Fabric): using "
                              "precision=\"bf16-mixed\" instead.");
    config.precision = "bf16-mixed";
  }
  const bool configured = options.strategy_spec() && options.strategy_spec()->name == strategy;
  config.strategy = resolve_strategy(strategy, configured, config, config.warnings);
  // As Python's connector (checked before its CPU fallback from 16-mixed): the model_parallel
  // strategy runs the precisions below only; a registered precision of the user's passes.
  const std::vector<std::string> model_parallel_precisions = {"32-true", "bf16-mixed", "bf16-true", "16-true"};
  const auto& built_in = precision_choices();
  LF_CHECK(config.strategy != "model_parallel" ||
               std::find(built_in.begin(), built_in.end(), asked_precision) == built_in.end() ||
               std::find(model_parallel_precisions.begin(), model_parallel_precisions.end(), asked_precision) !=
                   model_parallel_precisions.end(),
           ValueError, "strategy=\"model_parallel\" does not support precision=\"", asked_precision,
           "\" (as Python's ModelParallelStrategy). Choose one of: ", join_names(model_parallel_precisions), ".");
  return config;
}

Connector Connector::build(const FabricOptions& options, const env::EnvLookup& env) {
  Connector connector;
  connector.config = resolve_config(options, env);
  const ResolvedConfig& config = connector.config;

  auto precision_plugin = single_plugin<Precision>(options.plugins());
  LF_CHECK(!(precision_plugin && options.precision()), ValueError, "FabricOptions() got both precision(\"",
           *options.precision(), "\") and a precision plugin ('", precision_plugin ? precision_plugin->name() : "",
           "'). Choose one.");
  connector.precision = precision_plugin ? precision_plugin : precision_registry().create(config.precision);
  connector.accelerator = accelerator_registry().create(config.accelerator);
  connector.cluster_environment = cluster_environment_for(options, env);
  connector.cluster_environment->validate_settings(config.num_processes_per_node(), config.num_nodes);
  const auto& environment = *connector.cluster_environment;
  LF_CHECK(!(environment.creates_processes_externally() && environment.world_size() > 1 &&
             (config.strategy == "single_device" || config.strategy == "dp")),
           ValueError, "strategy=\"", config.strategy, "\" runs one process, but ", environment.launch_description(),
           " started this process as one of ", environment.world_size(), ". Use strategy \"ddp\" or \"fsdp\" (or ",
           "\"auto\"), or launch one process.");

  StrategyContext context;
  context.accelerator = connector.accelerator;
  context.cluster_environment = connector.cluster_environment;
  context.precision = connector.precision;
  context.num_nodes = config.num_nodes;
  context.env = env;
  for (int index : config.device_indices) context.parallel_devices.push_back(connector.accelerator->device_for(index));
  if (!context.parallel_devices.empty()) connector.precision->set_device_type(context.parallel_devices.front().type());
  const auto& spec = options.strategy_spec();
  if (spec && spec->name == config.strategy) {
    connector.strategy = spec->create(context);
  } else {
    if (spec) {
      connector.config.warnings.push_back("FabricOptions().strategy(...) configured \"" + spec->name +
                                          "\" with settings, but " + std::string(env::kStrategy) + "=\"" +
                                          config.strategy + "\" chose another strategy: those settings are unused.");
    }
    connector.strategy = strategy_registry().create(config.strategy, context);
  }
  for (const auto& warning : connector.config.warnings) rank_zero_warn(warning);
  return connector;
}

}  // namespace lightning::fabric
