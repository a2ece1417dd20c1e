#include "lightning/fabric/plugins/environments/cluster_environment.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "lightning/fabric/internal/published_port.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/process_group_settings.h"
#include "lightning/fabric/utilities/rank_zero.h"

namespace lightning::fabric {
namespace {

// Reads an int variable (a rank, a size, a port); a malformed or out-of-range value is a ValueError
// naming the variable.
std::optional<int> int_var(const env::EnvLookup& env, const std::string& name) { return env::Reader(env).int_value(name); }

int required_int(const env::EnvLookup& env, const std::string& name, const std::string& who) {
  auto value = int_var(env, name);
  LF_CHECK(value.has_value(), RuntimeError, who, " environment: ", name,
           " is not set. Launch with lightning-run or torchrun, which set it.");
  return *value;
}

// A variable the environment cannot do without: set and not empty, else a RuntimeError naming it.
std::string required_text(const env::EnvLookup& env, const std::string& name, const std::string& who) {
  auto value = env(name);
  LF_CHECK(value.has_value() && !value->empty(), RuntimeError, who, " environment: ", name,
           value.has_value() ? " is empty" : " is not set", ". The job's launcher sets it; when starting the "
           "workers yourself, set it (or choose another environment).");
  return *value;
}

// A text variable with a fallback when unset: set but empty is a RuntimeError naming it (an empty
// address would fail later, far from its cause).
std::optional<std::string> optional_text(const env::EnvLookup& env, const std::string& name, const std::string& who) {
  auto value = env(name);
  LF_CHECK(!value || !value->empty(), RuntimeError, who, " environment: ", name, " is empty. Set it to rank 0's host ",
           "name or address, or unset it for the default.");
  return value;
}

// "2(x3),1" -> {2, 2, 2, 1}: Slurm's compressed per-node task counts; empty when malformed.
std::vector<int> expand_task_counts(const std::string& value) {
  std::vector<int> counts;
  std::stringstream items(value);
  for (std::string item; std::getline(items, item, ',');) {
    try {
      const auto open = item.find("(x");
      const int count = std::stoi(item.substr(0, open));
      const int repeat = open == std::string::npos ? 1 : std::stoi(item.substr(open + 2));
      counts.insert(counts.end(), repeat, count);
    } catch (const std::exception&) {
      return {};
    }
  }
  return counts;
}

std::string launcher_text(const env::EnvLookup& env, const std::string& launcher,
                          const std::vector<const char*>& names) {
  std::string text = launcher + " (";
  bool first = true;
  for (const char* name : names) {
    if (auto value = env(name)) {
      text += (first ? "" : ", ") + std::string(name) + "=" + *value;
      first = false;
    }
  }
  return text + ")";
}

}  // namespace

void ClusterEnvironment::validate_settings(int num_devices, int num_nodes) const {
  if (auto launched = launched_processes_per_node()) {
    LF_CHECK(*launched == num_devices, ValueError, "Fabric is configured for devices=", num_devices,
             " per node, but the launcher started ", *launched, " processes on this node: ", launch_description(),
             ". Leave devices at \"auto\" (the default), which takes the launcher's count, or start as many "
             "processes per node as devices (srun --ntasks-per-node, torchrun --nproc-per-node, mpirun -npernode).");
  }
  if (auto nodes = launched_num_nodes()) {
    LF_CHECK(*nodes == num_nodes, ValueError, "Fabric is configured for num_nodes=", num_nodes,
             ", but the launcher's job spans ", *nodes, " nodes: ", launch_description(),
             ". Leave num_nodes unset, which takes the launcher's count, or make them match.");
  }
}

LightningEnvironment::LightningEnvironment(env::EnvLookup env) : env_(std::move(env)) {}

bool LightningEnvironment::creates_processes_externally() const { return env_(env::kLocalRank).has_value(); }

std::string LightningEnvironment::main_address() const {
  return optional_text(env_, env::kMasterAddr, "lightning").value_or("127.0.0.1");
}

int LightningEnvironment::main_port() const { return int_var(env_, env::kMasterPort).value_or(29400); }

int LightningEnvironment::local_rank() const { return int_var(env_, env::kLocalRank).value_or(0); }

int LightningEnvironment::node_rank() const {
  if (auto rank = int_var(env_, env::kNodeRank)) return *rank;
  return int_var(env_, env::kGroupRank).value_or(0);
}

TorchElasticEnvironment::TorchElasticEnvironment(env::EnvLookup env) : env_(std::move(env)) {}

bool TorchElasticEnvironment::detect(const env::EnvLookup& env) {
  for (const char* name : {env::kRunId, env::kRank, env::kGroupRank, env::kLocalRank, env::kLocalWorldSize}) {
    if (!env(name)) return false;
  }
  return true;
}

// Without MASTER_ADDR / MASTER_PORT / GROUP_RANK: Python Lightning's defaults (127.0.0.1, 12910,
// node 0), the first two with its warning.
std::string TorchElasticEnvironment::main_address() const {
  if (auto address = optional_text(env_, env::kMasterAddr, "torchelastic")) return *address;
  rank_zero_warn("torchelastic environment: MASTER_ADDR is not set; using 127.0.0.1.");
  return "127.0.0.1";
}

int TorchElasticEnvironment::main_port() const {
  if (auto port = int_var(env_, env::kMasterPort)) return *port;
  rank_zero_warn("torchelastic environment: MASTER_PORT is not set; using 12910.");
  return 12910;
}
int TorchElasticEnvironment::world_size() const { return required_int(env_, env::kWorldSize, "torchelastic"); }
int TorchElasticEnvironment::global_rank() const { return required_int(env_, env::kRank, "torchelastic"); }
int TorchElasticEnvironment::local_rank() const { return required_int(env_, env::kLocalRank, "torchelastic"); }
int TorchElasticEnvironment::node_rank() const { return int_var(env_, env::kGroupRank).value_or(0); }

std::optional<int> TorchElasticEnvironment::launched_processes_per_node() const {
  return int_var(env_, env::kLocalWorldSize);
}

std::optional<int> TorchElasticEnvironment::launched_num_nodes() const { return int_var(env_, env::kGroupWorldSize); }

std::string TorchElasticEnvironment::launch_description() const {
  return launcher_text(env_, "torchrun or lightning-run",
                       {env::kLocalWorldSize, env::kGroupWorldSize, env::kWorldSize});
}

// ---- host lists ----

std::vector<std::string> expand_host_list(const std::string& hosts) {
  // Split at commas and spaces outside brackets (Python Lightning reads "a b c" as three hosts),
  // drop spaces inside them ("1.2.3.[089, 100-110]"), then expand each prefix[ranges]suffix.
  std::vector<std::string> items;
  std::string current;
  int depth = 0;
  for (char c : hosts) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ' ' && depth > 0) continue;
    if ((c == ',' || c == ' ') && depth == 0) {
      if (!current.empty()) items.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) items.push_back(current);
  std::vector<std::string> result;
  for (const auto& item : items) {
    const auto open = item.find('[');
    if (open == std::string::npos) {
      result.push_back(item);
      continue;
    }
    const auto close = item.find(']', open);
    LF_CHECK(close != std::string::npos, ValueError, "Host list \"", hosts, "\" has an unclosed '['.");
    const std::string prefix = item.substr(0, open), suffix = item.substr(close + 1);
    std::stringstream ranges(item.substr(open + 1, close - open - 1));
    std::string range;
    while (std::getline(ranges, range, ',')) {
      const auto dash = range.find('-');
      const std::string first = range.substr(0, dash);
      const std::string last = dash == std::string::npos ? first : range.substr(dash + 1);
      LF_CHECK(!first.empty() && first.find_first_not_of("0123456789") == std::string::npos &&
                   !last.empty() && last.find_first_not_of("0123456789") == std::string::npos,
               ValueError, "Host list \"", hosts, "\" has an invalid range \"", range, "\".");
      const int from = std::stoi(first), to = std::stoi(last);
      for (int number = from; number <= to; ++number) {
        std::string digits = std::to_string(number);
        if (digits.size() < first.size()) digits.insert(0, first.size() - digits.size(), '0');  // keep zero padding
        result.push_back(prefix + digits + suffix);
      }
    }
  }
  return result;
}

// ---- SLURM ----

SLURMEnvironment::SLURMEnvironment(env::EnvLookup env) : env_(std::move(env)) {}

bool SLURMEnvironment::detect(const env::EnvLookup& env) {
  if (!env("SLURM_PROCID") || !(env("SLURM_STEP_ID") || env("SLURM_STEPID"))) return false;  // not an srun task
  auto tasks = int_var(env, "SLURM_STEP_NUM_TASKS");
  if (!tasks) tasks = int_var(env, "SLURM_NTASKS");
  return tasks && *tasks > 1;
}

std::string SLURMEnvironment::main_address() const {
  if (auto address = optional_text(env_, env::kMasterAddr, "slurm")) return *address;
  auto nodes = env_("SLURM_STEP_NODELIST");
  if (!nodes) nodes = env_("SLURM_NODELIST");
  if (!nodes) nodes = env_("SLURM_JOB_NODELIST");
  if (!nodes) return "127.0.0.1";  // outside a job: Python Lightning's default
  const auto hosts = expand_host_list(*nodes);
  LF_CHECK(!hosts.empty(), RuntimeError, "slurm environment: SLURM_NODELIST=\"", *nodes, "\" names no host.");
  return hosts.front();
}

// Python Lightning's rule, 15000 + the job id's last four digits, for step 0 (so mixed C++ and
// Python tasks of a step agree). Steps 1 to 4 of the job add 10000 each, so up to five steps of
// one allocation can run at once; steps whose ids differ by a multiple of 5 share a port.
int SLURMEnvironment::main_port() const {
  if (auto port = int_var(env_, env::kMasterPort)) return *port;
  const env::Reader reader(env_);
  const auto job_id = reader.integer("SLURM_JOB_ID");
  if (!job_id) return 12910;  // outside a job: Python Lightning's default
  const long long job = *job_id;
  auto step = reader.integer("SLURM_STEP_ID");
  if (!step) step = reader.integer("SLURM_STEPID");
  const long long lane = step && *step > 0 ? *step % 5 : 0;
  return 15000 + static_cast<int>(job % 10000 + 10000 * lane);
}

int SLURMEnvironment::world_size() const { return required_int(env_, "SLURM_NTASKS", "slurm"); }
int SLURMEnvironment::global_rank() const { return required_int(env_, "SLURM_PROCID", "slurm"); }
int SLURMEnvironment::local_rank() const { return required_int(env_, "SLURM_LOCALID", "slurm"); }
int SLURMEnvironment::node_rank() const { return required_int(env_, "SLURM_NODEID", "slurm"); }

std::optional<int> SLURMEnvironment::launched_processes_per_node() const {
  // The step's count on this node: "2(x3),1" lists one count per node of the step.
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    auto value = env_(name);
    if (!value) continue;
    const auto counts = expand_task_counts(*value);
    const int node = int_var(env_, "SLURM_NODEID").value_or(0);
    if (node >= 0 && node < static_cast<int>(counts.size())) return counts[node];
  }
  return std::nullopt;
}

std::optional<int> SLURMEnvironment::launched_num_nodes() const {
  if (auto nodes = int_var(env_, "SLURM_STEP_NUM_NODES")) return nodes;
  return int_var(env_, "SLURM_NNODES");
}

std::string SLURMEnvironment::launch_description() const {
  return launcher_text(env_, "srun", {"SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_NODES", "SLURM_NTASKS"});
}

// ---- LSF ----

LSFEnvironment::LSFEnvironment(env::EnvLookup env) : env_(std::move(env)) {}

bool LSFEnvironment::detect(const env::EnvLookup& env) {
  for (const char* name : {"LSB_JOBID", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK"}) {
    if (!env(name)) return false;
  }
  return env("LSB_DJOB_RANKFILE").has_value() || env("LSB_HOSTS").has_value();
}

std::vector<std::string> LSFEnvironment::compute_hosts() const {
  std::vector<std::string> lines;
  if (auto file = env_("LSB_DJOB_RANKFILE")) {
    std::ifstream in(*file);
    LF_CHECK(static_cast<bool>(in), RuntimeError, "lsf environment: cannot read LSB_DJOB_RANKFILE=", *file, ".");
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(line);
    }
  } else {
    std::stringstream hosts(required_text(env_, "LSB_HOSTS", "lsf"));
    for (std::string host; hosts >> host;) lines.push_back(host);
  }
  LF_CHECK(lines.size() >= 2, RuntimeError, "lsf environment: the host list names no compute node.");
  std::vector<std::string> unique;  // skip the launch node, keep first appearances in order
  for (size_t i = 1; i < lines.size(); ++i) {
    if (std::find(unique.begin(), unique.end(), lines[i]) == unique.end()) unique.push_back(lines[i]);
  }
  return unique;
}

std::string LSFEnvironment::main_address() const {
  if (auto address = optional_text(env_, env::kMasterAddr, "lsf")) return *address;
  return compute_hosts().front();
}

int LSFEnvironment::main_port() const {
  if (auto port = int_var(env_, env::kMasterPort)) return *port;
  return 10000 + required_int(env_, "LSB_JOBID", "lsf") % 1000;
}

int LSFEnvironment::world_size() const { return required_int(env_, "JSM_NAMESPACE_SIZE", "lsf"); }
int LSFEnvironment::global_rank() const { return required_int(env_, "JSM_NAMESPACE_RANK", "lsf"); }
int LSFEnvironment::local_rank() const { return required_int(env_, "JSM_NAMESPACE_LOCAL_RANK", "lsf"); }

int LSFEnvironment::node_rank() const {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const auto hosts = compute_hosts();
  const auto found = std::find(hosts.begin(), hosts.end(), std::string(host));
  LF_CHECK(found != hosts.end(), RuntimeError, "lsf environment: this host (", host, ") is not in the job's host list.");
  return static_cast<int>(found - hosts.begin());
}

std::optional<int> LSFEnvironment::launched_num_nodes() const {
  return static_cast<int>(compute_hosts().size());
}

std::optional<int> LSFEnvironment::launched_processes_per_node() const {
  const int nodes = *launched_num_nodes();
  const int world = world_size();
  if (world % nodes != 0) return std::nullopt;  // uneven placement: no single count per node
  return world / nodes;
}

// ---- MPI ----

MPIEnvironment::MPIEnvironment(env::EnvLookup env) : env_(std::move(env)) {}

bool MPIEnvironment::detect(const env::EnvLookup& env) {
  // A one-process job is like a plain run: the program may start its own processes.
  if (auto size = int_var(env, "OMPI_COMM_WORLD_SIZE")) return env("OMPI_COMM_WORLD_RANK") && *size > 1;
  auto size = int_var(env, "PMI_SIZE");
  return size && env("PMI_RANK") && *size > 1;
}

bool MPIEnvironment::single_node() const {
  auto nodes = launched_num_nodes();
  return nodes && *nodes == 1;
}

std::string MPIEnvironment::main_address() const {
  if (auto address = optional_text(env_, env::kMasterAddr, "mpi")) return *address;
  LF_CHECK(single_node(), RuntimeError, "mpi environment: the job spans ", launched_num_nodes().value_or(0),
           " nodes and MASTER_ADDR is not set. Export rank 0's host name or address to every rank, e.g. ",
           "mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 ... (run from the node of rank 0).");
  return "127.0.0.1";
}

int MPIEnvironment::main_port() const {
  if (auto port = int_var(env_, env::kMasterPort)) return *port;
  if (published_port_) return *published_port_;
  auto directory = env_("PMIX_SERVER_TMPDIR");
  auto job = env_("PMIX_NAMESPACE");
  LF_CHECK(single_node() && directory && job, RuntimeError, "mpi environment: MASTER_PORT is not set",
           single_node() ? " and this MPI gives no job directory (PMIX_SERVER_TMPDIR) to agree on one. "
                         : " and the job spans several nodes. ",
           "Export a free port to every rank, e.g. mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 ...");
  const std::string path = *directory + "/lightning-fabric-" + *job + ".port";
  const auto timeout = with_environment_overrides(ProcessGroupSettings(), env_).rendezvous_timeout;
  published_port_ = global_rank() == 0 ? internal::publish_free_port(path) : internal::read_published_port(path, timeout);
  return *published_port_;
}

int MPIEnvironment::world_size() const {
  if (auto size = int_var(env_, "OMPI_COMM_WORLD_SIZE")) return *size;
  if (auto size = int_var(env_, "PMI_SIZE")) return *size;
  LF_CHECK(false, RuntimeError, "mpi environment: neither OMPI_COMM_WORLD_SIZE (Open MPI) nor PMI_SIZE (MPICH, Intel "
           "MPI) is set. Start the ranks with mpirun, which sets them.");
  return 0;
}

int MPIEnvironment::global_rank() const {
  if (auto rank = int_var(env_, "OMPI_COMM_WORLD_RANK")) return *rank;
  if (auto rank = int_var(env_, "PMI_RANK")) return *rank;
  LF_CHECK(false, RuntimeError, "mpi environment: neither OMPI_COMM_WORLD_RANK (Open MPI) nor PMI_RANK (MPICH, Intel "
           "MPI) is set. Start the ranks with mpirun, which sets them.");
  return 0;
}

int MPIEnvironment::local_rank() const {
  if (auto rank = int_var(env_, "OMPI_COMM_WORLD_LOCAL_RANK")) return *rank;
  return int_var(env_, "MPI_LOCALRANKID").value_or(0);
}

int MPIEnvironment::node_rank() const {
  if (auto rank = int_var(env_, "OMPI_COMM_WORLD_NODE_RANK")) return *rank;
  auto local_size = int_var(env_, "OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!local_size) local_size = int_var(env_, "MPI_LOCALNRANKS");
  return local_size && *local_size > 0 ? global_rank() / *local_size : 0;  // block placement assumed
}

// ---- Kubeflow ----

KubeflowEnvironment::KubeflowEnvironment(env::EnvLookup env) : env_(std::move(env)) {}

bool KubeflowEnvironment::detect(const env::EnvLookup& env) {
  for (const char* name : {"KUBERNETES_PORT", env::kMasterAddr, env::kMasterPort, env::kWorldSize, env::kRank}) {
    if (!env(name)) return false;
  }
  return true;
}

std::string KubeflowEnvironment::main_address() const { return required_text(env_, env::kMasterAddr, "kubeflow"); }
int KubeflowEnvironment::main_port() const { return required_int(env_, env::kMasterPort, "kubeflow"); }
int KubeflowEnvironment::world_size() const { return required_int(env_, env::kWorldSize, "kubeflow"); }
int KubeflowEnvironment::global_rank() const { return required_int(env_, env::kRank, "kubeflow"); }

std::shared_ptr<ClusterEnvironment> detect_cluster_environment(const env::EnvLookup& env) {
  if (TorchElasticEnvironment::detect(env)) return std::make_shared<TorchElasticEnvironment>(env);
  if (SLURMEnvironment::detect(env)) return std::make_shared<SLURMEnvironment>(env);
  if (LSFEnvironment::detect(env)) return std::make_shared<LSFEnvironment>(env);
  if (MPIEnvironment::detect(env)) return std::make_shared<MPIEnvironment>(env);
  if (KubeflowEnvironment::detect(env)) return std::make_shared<KubeflowEnvironment>(env);
  return std::make_shared<LightningEnvironment>(env);
}

std::optional<int> MPIEnvironment::launched_processes_per_node() const {
  auto local_size = int_var(env_, "OMPI_COMM_WORLD_LOCAL_SIZE");
  return local_size ? local_size : int_var(env_, "MPI_LOCALNRANKS");
}

std::optional<int> MPIEnvironment::launched_num_nodes() const {
  if (auto nodes = int_var(env_, "OMPI_MCA_orte_num_nodes")) return nodes;
  auto local_size = launched_processes_per_node();
  if (!local_size || *local_size <= 0) return std::nullopt;
  const int world = world_size();
  if (world % *local_size != 0) return std::nullopt;  // uneven placement: unknown
  return world / *local_size;
}

std::string MPIEnvironment::launch_description() const {
  return launcher_text(env_, "mpirun", {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "OMPI_MCA_orte_num_nodes",
                                   "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"});
}

}  // namespace lightning::fabric
