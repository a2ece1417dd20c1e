#include "lightning/fabric/plugins/environments/cluster_environment.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {
namespace {

// Reads an integer variable; a malformed value is an error naming the variable.
std::optional<int> int_var(const env::EnvLookup& env, const std::string& name) {
  auto value = env(name);
  if (!value) return std::nullopt;
  try {
    size_t used = 0;
    int parsed = std::stoi(*value, &used);
    if (used == value->size()) return parsed;
  } catch (const std::exception&) {
  }
  throw ValueError("Environment variable " + name + "=\"" + *value + "\" is not an integer. Fix or unset it.");
}

int required_int(const env::EnvLookup& env, const std::string& name, const std::string& who) {
  auto value = int_var(env, name);
  LF_CHECK(value.has_value(), RuntimeError, who, " environment: ", name,
           " is not set. Launch with lightning-run or torchrun, which set it.");
  return *value;
}

}  // namespace

LightningEnvironment::LightningEnvironment(env::EnvLookup env) : env_(std::move(env)) {}

bool LightningEnvironment::creates_processes_externally() const { return env_(env::kLocalRank).has_value(); }

std::string LightningEnvironment::main_address() const {
  return env_(env::kMasterAddr).value_or("127.0.0.1");
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

std::string TorchElasticEnvironment::main_address() const {
  auto address = env_(env::kMasterAddr);
  LF_CHECK(address.has_value(), RuntimeError, "torchelastic environment: MASTER_ADDR is not set.");
  return *address;
}

int TorchElasticEnvironment::main_port() const { return required_int(env_, env::kMasterPort, "torchelastic"); }
int TorchElasticEnvironment::world_size() const { return required_int(env_, env::kWorldSize, "torchelastic"); }
int TorchElasticEnvironment::global_rank() const { return required_int(env_, env::kRank, "torchelastic"); }
int TorchElasticEnvironment::local_rank() const { return required_int(env_, env::kLocalRank, "torchelastic"); }
int TorchElasticEnvironment::node_rank() const { return required_int(env_, env::kGroupRank, "torchelastic"); }

void TorchElasticEnvironment::validate_settings(int num_devices, int num_nodes) const {
  // Per node, not WORLD_SIZE: nodes may run different numbers of processes.
  (void)num_nodes;
  const int local_world = required_int(env_, env::kLocalWorldSize, "torchelastic");
  LF_CHECK(local_world == num_devices, ValueError, "The launcher started LOCAL_WORLD_SIZE=", local_world,
           " processes on this node, but this Fabric is configured for devices=", num_devices,
           ". Make the launcher's --devices (torchrun: --nproc-per-node) match the Fabric options, or "
           "leave devices at \"auto\" and launch with lightning-run, which passes its value in LT_DEVICES.");
}

std::optional<int> TorchElasticEnvironment::launched_processes_per_node() const {
  return int_var(env_, env::kLocalWorldSize);
}

// ---- host lists ----

std::vector<std::string> expand_host_list(const std::string& hosts) {
  // Split at commas outside brackets, then expand each prefix[ranges]suffix.
  std::vector<std::string> items;
  std::string current;
  int depth = 0;
  for (char c : hosts) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
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
  if (!env("SLURM_NTASKS")) return false;
  const auto job_name = env("SLURM_JOB_NAME");
  return !(job_name && (*job_name == "bash" || *job_name == "interactive"));
}

std::string SLURMEnvironment::main_address() const {
  if (auto address = env_(env::kMasterAddr)) return *address;
  auto nodes = env_("SLURM_NODELIST");
  if (!nodes) nodes = env_("SLURM_JOB_NODELIST");
  LF_CHECK(nodes.has_value(), RuntimeError, "slurm environment: neither MASTER_ADDR nor SLURM_NODELIST is set.");
  const auto hosts = expand_host_list(*nodes);
  LF_CHECK(!hosts.empty(), RuntimeError, "slurm environment: SLURM_NODELIST=\"", *nodes, "\" names no host.");
  return hosts.front();
}

int SLURMEnvironment::main_port() const {
  if (auto port = int_var(env_, env::kMasterPort)) return *port;
  auto job = env_("SLURM_JOB_ID");
  if (!job) return 15000;
  const std::string digits = job->size() > 4 ? job->substr(job->size() - 4) : *job;
  return 15000 + std::stoi(digits);
}

int SLURMEnvironment::world_size() const { return required_int(env_, "SLURM_NTASKS", "slurm"); }
int SLURMEnvironment::global_rank() const { return required_int(env_, "SLURM_PROCID", "slurm"); }
int SLURMEnvironment::local_rank() const { return required_int(env_, "SLURM_LOCALID", "slurm"); }
int SLURMEnvironment::node_rank() const { return required_int(env_, "SLURM_NODEID", "slurm"); }

void SLURMEnvironment::validate_settings(int num_devices, int num_nodes) const {
  if (auto per_node = env_("SLURM_NTASKS_PER_NODE")) {
    const std::string first = per_node->substr(0, per_node->find('('));  // "2(x3)" -> "2"
    LF_CHECK(std::stoi(first) == num_devices, ValueError, "Fabric is configured for devices=", num_devices,
             " per node, but SLURM runs --ntasks-per-node=", *per_node,
             ". Make them match (e.g. srun --ntasks-per-node=", num_devices, ").");
  }
  if (auto nodes = int_var(env_, "SLURM_NNODES")) {
    LF_CHECK(*nodes == num_nodes, ValueError, "Fabric is configured for num_nodes=", num_nodes,
             ", but the SLURM allocation has SLURM_NNODES=", *nodes, ". Make them match.");
  }
}

std::optional<int> SLURMEnvironment::launched_processes_per_node() const {
  // Per step when srun started this process, else the allocation's: "2(x3)" -> 2.
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}) {
    if (auto value = env_(name)) {
      try {
        return std::stoi(value->substr(0, value->find('(')));
      } catch (const std::exception&) {
      }
    }
  }
  return std::nullopt;
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
    std::stringstream hosts(*env_("LSB_HOSTS"));
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
  if (auto address = env_(env::kMasterAddr)) return *address;
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

// ---- MPI ----

MPIEnvironment::MPIEnvironment(env::EnvLookup env) : env_(std::move(env)) {}

bool MPIEnvironment::detect(const env::EnvLookup& env) {
  return (env("OMPI_COMM_WORLD_SIZE") && env("OMPI_COMM_WORLD_RANK")) || (env("PMI_SIZE") && env("PMI_RANK"));
}

std::string MPIEnvironment::main_address() const { return env_(env::kMasterAddr).value_or("127.0.0.1"); }

int MPIEnvironment::main_port() const {
  auto port = int_var(env_, env::kMasterPort);
  LF_CHECK(port.has_value(), RuntimeError, "mpi environment: MASTER_PORT is not set. Export a free port and node 0's ",
           "address to every rank, e.g. mpirun -x MASTER_ADDR=node0 -x MASTER_PORT=29500 ...");
  return *port;
}

int MPIEnvironment::world_size() const {
  if (auto size = int_var(env_, "OMPI_COMM_WORLD_SIZE")) return *size;
  return required_int(env_, "PMI_SIZE", "mpi");
}

int MPIEnvironment::global_rank() const {
  if (auto rank = int_var(env_, "OMPI_COMM_WORLD_RANK")) return *rank;
  return required_int(env_, "PMI_RANK", "mpi");
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

std::string KubeflowEnvironment::main_address() const { return *env_(env::kMasterAddr); }
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

}  // namespace lightning::fabric
