#include "lightning/launcher/args.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <sstream>

#include "lightning/fabric/accelerators/accelerator.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/hang/hang_report.h"
#include "lightning/fabric/plugins/collectives/process_group_settings.h"
#include "lightning/fabric/plugins/precision/precision.h"
#include "lightning/fabric/registry.h"
#include "lightning/fabric/utilities/profiler.h"
#include "lightning/fabric/strategies/strategy.h"
#include "lightning/fabric/utilities/devices.h"
#include "lightning/fabric/version.h"
#include "lightning/launcher/numa_binding.h"

namespace lightning::launcher {
namespace {

// The choices come from the runtime's registries, as the workers' Connector checks them. The
// launcher never loads the program, so names a program registers itself are not among them: such
// a program selects them in code or through the environment (LT_STRATEGY / LT_PRECISION), which
// the workers inherit (docs/launcher.md, "Choices").
constexpr const char* kOwnRegistrationHint =
    " A name your program registers itself is unknown here: set it in code (FabricOptions()), or export "
    "LT_STRATEGY / LT_PRECISION for its workers instead of passing the flag.";

std::vector<std::string> backend_choices() {
  std::vector<std::string> names;
  for (auto backend : fabric::kProcessGroupBackends) names.push_back(fabric::to_string(backend));
  return names;
}

// A choice validator whose message names the flag, the value and the choices (and hint, if any).
CLI::Validator one_of(const std::string& flag, const std::vector<std::string>& choices, const std::string& hint = "") {
  return CLI::Validator(
      [flag, choices, hint](std::string& value) -> std::string {
        for (const auto& choice : choices) {
          if (value == choice) return {};
        }
        return flag + "=" + value + " is not valid. Choose one of: " + fabric::join_names(choices) + "." + hint;
      },
      "{" + fabric::join_names(choices) + "}");
}

std::set<int> parse_rank_list(const std::string& text) {
  std::set<int> ranks;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    int rank = -1;
    try {
      rank = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || rank < 0) {
      throw CLI::ValidationError("--local-ranks-filter=" + text +
                                 " is not valid: give local ranks as a comma list, e.g. 0 or 0,2.");
    }
    ranks.insert(rank);
  }
  return ranks;
}

std::string signal_names() {
  std::vector<std::string> names;
  for (const auto& entry : handleable_signals()) names.push_back(entry.first);
  return fabric::join_names(names);
}

// --signals-to-handle SIGTERM,SIGINT (torchrun's spelling: names with SIG, blanks around them allowed).
std::vector<int> parse_signal_list(const std::string& text) {
  std::vector<int> signals;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    const auto begin = item.find_first_not_of(" \t");
    if (begin == std::string::npos) continue;
    item = item.substr(begin, item.find_last_not_of(" \t") - begin + 1);
    const auto& known = handleable_signals();
    const auto found = std::find_if(known.begin(), known.end(), [&](const auto& entry) { return entry.first == item; });
    if (found == known.end()) {
      throw CLI::ValidationError("--signals-to-handle=" + text + " is not valid: '" + item +
                                 "' is not a signal lightning-run can handle. Give a comma list of: " + signal_names() +
                                 " (default: SIGTERM,SIGINT,SIGHUP,SIGQUIT).");
    }
    if (std::find(signals.begin(), signals.end(), found->second) == signals.end()) signals.push_back(found->second);
  }
  if (signals.empty()) {
    throw CLI::ValidationError("--signals-to-handle=" + text + " names no signal: give a comma list such as "
                               "SIGTERM,SIGINT,SIGHUP,SIGQUIT (the default), from: " + signal_names() + ".");
  }
  return signals;
}

int parse_node_count(const std::string& text, const std::string& whole) {
  size_t used = 0;
  int count = 0;
  try {
    count = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || count < 1 || count > (1 << 20)) {
    throw CLI::ValidationError("--num-nodes=" + whole + " is not valid: give a node count such as 2, or MIN:MAX such as 2:4 "
                               "for an elastic job (1 <= MIN <= MAX).");
  }
  return count;
}

// --num-nodes N (fixed) or MIN:MAX (elastic; torchrun's spelling).
void parse_num_nodes(const std::string& text, LaunchArgs& args) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    args.num_nodes = parse_node_count(text, text);
    return;
  }
  const int min = parse_node_count(text.substr(0, colon), text), max = parse_node_count(text.substr(colon + 1), text);
  if (min > max) {
    throw CLI::ValidationError("--num-nodes=" + text + " is not valid: MIN (" + std::to_string(min) + ") exceeds MAX (" +
                               std::to_string(max) + "). Write MIN:MAX, e.g. " + std::to_string(max) + ":" +
                               std::to_string(min) + ".");
  }
  args.elastic = LaunchArgs::NodeRange{min, max};
  args.num_nodes = max;
}

// Raw values of the options whose absence matters (they are optional in LaunchArgs).
struct RawOptions {
  std::string num_nodes = "1";
  std::string accelerator, strategy, precision, log_dir, ranks_filter, profile, profile_ranks, numa_binding, local_addr;
  std::string signals = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  int main_port = kDefaultMainPort;
  bool tag = false, no_tag = false;
  bool no_store_relay = false;
};

void add_model_options(CLI::App& model, LaunchArgs& args, RawOptions& raw) {
  model.add_option("--accelerator", raw.accelerator, "Hardware the workers use (default: auto)")->check(one_of("--accelerator", fabric::accelerator_choices()));
  model.add_option("--strategy", raw.strategy, "Strategy the workers use (default: the program's)")->check(one_of("--strategy", fabric::strategy_choices(), kOwnRegistrationHint));
  model.add_option("--devices", args.devices, "Devices (workers) per node: a count, or GPU indices such as 0,2")->capture_default_str();
  model.add_option("--num-nodes,--num_nodes,--nnodes", raw.num_nodes,
                   "Number of nodes (machines), or MIN:MAX for an elastic job")->capture_default_str();
  model.add_option("--node-rank,--node_rank", args.node_rank, "This node's rank, 0 .. num-nodes - 1")->capture_default_str()
      ->check(CLI::NonNegativeNumber.description(""));
  model.add_option("--main-address,--main_address", args.main_address, "Address of node 0 (hosts the rendezvous)")->capture_default_str();
  model.add_option("--main-port,--main_port", raw.main_port, "Port of the rendezvous on node 0 (default 29400; a single-node run without it picks a free port)")
      ->check(CLI::Range(1, 65535).description(""));
  model.add_option("--precision", raw.precision, "Precision the workers use (default: the program's)")->check(one_of("--precision", fabric::precision_choices(), kOwnRegistrationHint));
  model.add_option("--max-restarts,--max_restarts", args.max_restarts, "Restart the whole job this many times after a failure")->capture_default_str()
      ->check(CLI::NonNegativeNumber.description(""));
  model.add_option("--in-memory-replicas,--in_memory_replicas", args.in_memory_replicas,
                   "Every K steps, fabric.snapshot() keeps the workers' state in this launcher's memory, copied to a "
                   "buddy node's; a restarted worker resumes from it with fabric.restore_snapshot() (0: off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber.description(""));
  model.add_option("--shutdown-grace,--shutdown_grace", args.shutdown_grace_s, "Seconds between the polite signal and SIGKILL")->capture_default_str()
      ->check(CLI::NonNegativeNumber.description(""));
  model.add_option("--rdzv-timeout,--rdzv_timeout", args.rdzv_timeout_s, "Seconds nodes wait for each other")->capture_default_str()
      ->check(CLI::PositiveNumber.description(""));
  model.add_option("--rdzv-last-call,--rdzv_last_call", args.rdzv_last_call_s,
                   "Elastic jobs: once MIN nodes are in, seconds a rendezvous round waits for more")->capture_default_str()
      ->check(CLI::NonNegativeNumber.description(""));
  model.add_option("--node-timeout,--node_timeout", args.node_timeout_s,
                   "Seconds without word from another node (its heartbeat, or node 0's store) before it counts as lost")
      ->capture_default_str()->check(CLI::Range(3.0, 1e9).description(""));
  model.add_option("--finish-timeout,--finish_timeout", args.finish_timeout_s,
                   "After one worker succeeds, stop the others if they run longer than this (0: wait)")->capture_default_str()
      ->check(CLI::NonNegativeNumber.description(""));
  model.add_option("--hang-timeout,--hang_timeout", args.hang_timeout_s,
                   "Seconds a rank may wait in one collective before the job is reported as hung, dumped and stopped "
                   "with exit code " + std::to_string(fabric::kHangExitCode) + " (0: off; default: the program's, " +
                       std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                          fabric::ProcessGroupSettings().hang_timeout).count()) + ")")
      ->check(CLI::NonNegativeNumber.description(""));
  model.add_option("--process-group-backend,--process_group_backend", args.process_group_backend,
                   "Collective backend of the workers: gloo, nccl, or shm (CPU, one machine; the default there)")
      ->check(one_of("--process-group-backend", backend_choices()));
  model.add_option("--straggler-threshold,--straggler_threshold", args.straggler_threshold_s,
                   "Name a rank that arrives last at 80% of the last 32 collectives by a median of at least this many "
                   "seconds (0: off; default: the program's, 0.05)")
      ->check(CLI::NonNegativeNumber.description(""));
  model.add_flag("--check-collectives", args.check_collectives,
                 "Compare every collective's op, dtype and shape across ranks before it runs (one small all_gather each)");
  model.add_flag("--no-store-relay", raw.no_store_relay,
                 "Multi-node: every worker connects to the job's store itself, instead of through its node's "
                 "lightning-run (one connection per node)");
  model.add_option("--log-dir,--log_dir", raw.log_dir, "Write each worker's stdout and stderr to files here");
  model.add_option("--profile", raw.profile,
                   "Record a Kineto trace of these optimizer steps on every rank, e.g. 10-15 (files: LOG_DIR/profile/"
                   "trace-rank<R>.json, or ./profile/ without --log-dir)");
  model.add_option("--profile-ranks,--profile_ranks", raw.profile_ranks, "Profile only these global ranks, e.g. 0 or 0,3");
  model.add_flag("--tag-output", raw.tag, "Prefix every output line with its rank (default with more than one worker)");
  model.add_flag("--no-tag-output", raw.no_tag, "Never prefix output lines");
  model.add_flag("--timestamp-output", args.timestamp_output, "Prefix output lines with the time");
  model.add_option("--local-ranks-filter,--local_ranks_filter", raw.ranks_filter, "Only these local ranks reach the console, e.g. 0 or 0,2");
  model.add_flag("--dry-run,--dry_run", args.dry_run, "Print each worker's command and environment; start nothing");
  // torchrun's flags.
  model.add_option("--numa-binding,--numa_binding", raw.numa_binding,
                   "Bind each worker to CPUs near its device (torchrun's modes): node = its GPU's NUMA node, socket = "
                   "that node's socket, exclusive = a share of the node's cores of its own, core-complex = one L3 "
                   "complex of the node. Without GPUs, local ranks spread evenly over the NUMA nodes")
      ->check(one_of("--numa-binding", numa_binding_choices()));
  model.add_option("--local-addr,--local_addr", raw.local_addr,
                   "The address this node announces in the rendezvous (default: its host name), for a host with "
                   "several interfaces");
  model.add_flag("--virtual-local-rank,--virtual_local_rank", args.virtual_local_rank,
                 "Every worker gets LOCAL_RANK=0 and, on CUDA, CUDA_VISIBLE_DEVICES of its one GPU (its device 0)");
  model.add_option("--signals-to-handle,--signals_to_handle", raw.signals,
                   "Signals that stop the job: forwarded to the workers, which are then stopped, exit 128 + signal; "
                   "the others take their default action (SIGUSR1/SIGUSR2 not listed: forwarded, the job goes on). "
                   "From: " + signal_names())
      ->capture_default_str();
}

// CLI11 2.1 has no App::usage(): its help's "Usage:" line comes from the formatter. Both help pages
// show the real forms, with the program and its arguments after the options.
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "\nUsage: lightning-run model [OPTIONS] BINARY [ARGS...]\n"
           "       lightning-run model consolidate FOLDER [--output-file PATH]   (merge a sharded checkpoint)\n"
           "       lightning-run status HOST:PORT [--timeout SECONDS]           (where every rank of a running job is)\n";
  }
};

}  // namespace

ParsedCommandLine parse_command_line(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  ParsedCommandLine parsed;
  LaunchArgs& args = parsed.args;
  RawOptions raw;

  CLI::App app{"lightning-run: launch a Lightning Fabric C++ program on one or many devices and nodes"};
  app.name("lightning-run");
  app.set_version_flag("--version", std::string("lightning-run ") + fabric::kVersion);
  app.require_subcommand(1);
  app.formatter(std::make_shared<UsageFormatter>());
  app.footer("Examples:\n"
             "  lightning-run model --accelerator cpu --devices 2 build/bin/image_classifier --epochs 1\n"
             "  lightning-run model consolidate checkpoints/epoch=1-step=469.ckpt\n"
             "  lightning-run status 127.0.0.1:29400\n"
             "lightning-run model --help lists the launch options.");
  CLI::App* model = app.add_subcommand("model", "Run BINARY [ARGS...] once per device (everything after BINARY goes to "
                                                "it), or merge a sharded checkpoint: model consolidate FOLDER");
  model->footer("BINARY is the program to run once per device, followed by its own arguments; every option of\n"
                "lightning-run comes before it. Example:\n"
                "  lightning-run model --accelerator cpu --devices 2 build/bin/image_classifier --epochs 1");
  model->prefix_command();
  add_model_options(*model, args, raw);

  // CLI11 treats what follows a literal "--" as positionals, not as the prefix command: parse
  // only the words before it, and append the words after it to the program's arguments.
  std::vector<std::string> words(argv + 1, argv + argc);
  const auto separator = std::find(words.begin(), words.end(), "--");
  const std::vector<std::string> after(separator == words.end() ? words.end() : separator + 1, words.end());
  std::vector<std::string> before(words.begin(), separator);
  std::reverse(before.begin(), before.end());  // CLI11 takes the reversed vector form
  try {
    if (words.empty() || (words.front() != "model" && words.front().rfind("-", 0) != 0)) {
      throw CLI::ValidationError((words.empty() ? std::string("a command is required") : "unknown command '" + words.front() + "'") +
                                 ". The commands are: model [OPTIONS] BINARY [ARGS...] (launch), model consolidate "
                                 "FOLDER (merge a sharded checkpoint), and status HOST:PORT (look inside a running job).");
    }
    app.parse(before);
    std::vector<std::string> rest = model->remaining();
    if (separator != words.end()) {
      if (!rest.empty()) rest.push_back("--");  // the "--" belonged to the program's arguments
      rest.insert(rest.end(), after.begin(), after.end());
    }
    if (rest.empty()) throw CLI::ValidationError("lightning-run model needs the program to run: lightning-run model [OPTIONS] BINARY [ARGS...]");
    if (rest.front().size() > 1 && rest.front()[0] == '-') {
      throw CLI::ValidationError("unknown flag " + rest.front() + " (a program whose name starts with '-' is written ./" +
                                 rest.front() + ").");
    }
    args.binary = rest.front();
    args.binary_args.assign(rest.begin() + 1, rest.end());
    auto given = [&](const std::string& flag) { return model->count(flag) > 0; };
    if (given("--accelerator")) args.accelerator = raw.accelerator;
    if (given("--strategy")) args.strategy = raw.strategy;
    if (given("--precision")) args.precision = raw.precision;
    if (given("--main-port")) args.main_port = raw.main_port;
    if (given("--log-dir")) args.log_dir = raw.log_dir;
    if (given("--local-ranks-filter")) args.local_ranks_filter = parse_rank_list(raw.ranks_filter);
    if (given("--numa-binding")) args.numa_binding = raw.numa_binding;
    if (given("--local-addr")) {
      if (raw.local_addr.find_first_not_of(" \t") == std::string::npos || raw.local_addr.find(' ') != std::string::npos) {
        throw CLI::ValidationError("--local-addr='" + raw.local_addr + "' is not valid: give this node's address or "
                                   "host name as the other nodes reach it, e.g. --local-addr 10.0.1.5.");
      }
      args.local_addr = raw.local_addr;
    }
    args.signals_to_handle = parse_signal_list(raw.signals);
    try {
      if (given("--profile")) {
        fabric::parse_profile_steps(raw.profile, "--profile");
        args.profile = raw.profile;
      }
      if (given("--profile-ranks")) {
        fabric::parse_profile_ranks(raw.profile_ranks, "--profile-ranks");
        args.profile_ranks = raw.profile_ranks;
      }
    } catch (const fabric::ValueError& error) {
      throw CLI::ValidationError(error.what());
    }
    if (args.profile_ranks && !args.profile) {
      throw CLI::ValidationError("--profile-ranks chooses the ranks of --profile STEPS: give --profile too.");
    }
    if (raw.tag && raw.no_tag) throw CLI::ValidationError("--tag-output and --no-tag-output contradict each other: give one.");
    if (raw.tag) args.tag_output = true;
    if (raw.no_tag) args.tag_output = false;
    args.store_relay = !raw.no_store_relay;
    parse_num_nodes(raw.num_nodes, args);
    if (args.elastic && given("--node-rank")) {
      throw CLI::ValidationError("--node-rank=" + std::to_string(args.node_rank) + " cannot be given with --num-nodes=" +
                                 raw.num_nodes + ": an elastic job's rendezvous assigns node ranks at every round. "
                                 "Leave --node-rank out; the node whose --main-address is its own hosts the rendezvous.");
    }
    if (!args.elastic && given("--rdzv-last-call")) {
      throw CLI::ValidationError("--rdzv-last-call applies to elastic jobs only: give --num-nodes MIN:MAX, or leave it out.");
    }
    if (args.node_rank >= args.num_nodes) {
      throw CLI::ValidationError("--node-rank=" + std::to_string(args.node_rank) + " is out of range for --num-nodes=" +
                                 std::to_string(args.num_nodes) + ": node ranks are 0 .. " +
                                 std::to_string(args.num_nodes - 1) + ".");
    }
    if (args.virtual_local_rank && args.strategy && *args.strategy == "dp") {
      throw CLI::ValidationError("--virtual-local-rank gives each worker one GPU, but --strategy dp runs one process "
                                 "over all of them: leave one of the two out.");
    }
    local_process_count(args);  // validates --devices against the accelerator
  } catch (const CLI::CallForHelp& help) {
    out << (model->parsed() ? model->help() : app.help());
    parsed.exit_now = 0;
  } catch (const CLI::CallForVersion&) {
    out << "lightning-run " << fabric::kVersion << "\n";
    parsed.exit_now = 0;
  } catch (const CLI::ParseError& error) {
    err << "lightning-run: " << error.what() << "\nRun 'lightning-run model --help' for the flags.\n";
    parsed.exit_now = 2;
  } catch (const fabric::Error& error) {
    err << "lightning-run: --devices: " << error.what() << "\n";
    parsed.exit_now = 2;
  }
  return parsed;
}

std::string format_seconds(double seconds) {
  std::ostringstream text;
  text << seconds;
  return text.str();
}

std::string resolved_accelerator(const LaunchArgs& args) {
  return fabric::resolve_accelerator(args.accelerator.value_or("auto"), "--accelerator");
}

std::vector<int> local_gpu_indices(const LaunchArgs& args) {
  if (resolved_accelerator(args) != "cuda") return {};
  return fabric::accelerator_registry().create("cuda")->parse_devices(fabric::DevicesSpec(args.devices));
}

const std::vector<std::pair<std::string, int>>& handleable_signals() {
  static const std::vector<std::pair<std::string, int>> signals = {
      {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT}, {"SIGTERM", SIGTERM},
      {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGALRM", SIGALRM}, {"SIGXCPU", SIGXCPU}};
  return signals;
}

int local_process_count(const LaunchArgs& args) {
  if (args.strategy && *args.strategy == "dp") return 1;
  const auto accelerator = fabric::accelerator_registry().create(resolved_accelerator(args));
  return static_cast<int>(accelerator->parse_devices(fabric::DevicesSpec(args.devices)).size());
}

}  // namespace lightning::launcher
