// Cluster environments: where a process learns its rank, the world size and the main address.
// Detected in Lightning's order (TorchElastic, SLURM, LSF, MPI, then Lightning's own); the
// Lightning environment with no rank variables means "not launched": Fabric::launch() may spawn.
#pragma once

#include "lightning/fabric/export.h"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric/plugins/plugin.h"
#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric {

class LF_API ClusterEnvironment : public Plugin {
 public:
  /// True when something else (a launcher, the scheduler) created this process per rank.
  virtual bool creates_processes_externally() const = 0;
  virtual std::string main_address() const = 0;
  virtual int main_port() const = 0;
  virtual int world_size() const = 0;
  virtual int global_rank() const = 0;
  virtual int local_rank() const = 0;
  virtual int node_rank() const = 0;
  /// How many processes the external launcher started on this node, when its variables say so:
  /// devices "auto" resolves to this count (one device per process), so a program started by
  /// torchrun, srun or mpirun needs no devices flag. nullopt: not launched externally, or unknown.
  virtual std::optional<int> launched_processes_per_node() const { return std::nullopt; }
  /// How many nodes the external launcher's job spans, when its variables say so: num_nodes left
  /// unset in code resolves to this count. nullopt: not launched externally, or unknown.
  virtual std::optional<int> launched_num_nodes() const { return std::nullopt; }
  /// Where the two counts come from, for error messages, e.g. "srun (SLURM_STEP_TASKS_PER_NODE=4)".
  virtual std::string launch_description() const { return name(); }
  /// Called by the Connector with the resolved devices per node and num_nodes: a value that
  /// disagrees with what the launcher started is a ValueError naming both and the fix.
  virtual void validate_settings(int num_devices, int num_nodes) const;
  /// The Lightning environment learns its rank from the strategy; others ignore these.
  virtual void set_world_size(int size) { (void)size; }
  virtual void set_global_rank(int rank) { (void)rank; }
};

/// Lightning's own: MASTER_ADDR/MASTER_PORT/NODE_RANK/LOCAL_RANK; ranks from the strategy when
/// the process was not launched externally.
class LF_API LightningEnvironment : public ClusterEnvironment {
 public:
  explicit LightningEnvironment(env::EnvLookup env = env::process_env());
  std::string name() const override { return "lightning"; }
  bool creates_processes_externally() const override;
  std::string main_address() const override;
  int main_port() const override;
  int world_size() const override { return world_size_; }
  int global_rank() const override { return global_rank_; }
  int local_rank() const override;
  int node_rank() const override;
  void set_world_size(int size) override { world_size_ = size; }
  void set_global_rank(int rank) override { global_rank_ = rank; }

 private:
  env::EnvLookup env_;
  int world_size_ = 1;
  int global_rank_ = 0;
};

/// torchrun / lightning-run: every rank variable comes from the environment.
class LF_API TorchElasticEnvironment : public ClusterEnvironment {
 public:
  explicit TorchElasticEnvironment(env::EnvLookup env = env::process_env());
  /// True when TORCHELASTIC_RUN_ID and the rank variables are set.
  static bool detect(const env::EnvLookup& env);
  std::string name() const override { return "torchelastic"; }
  bool creates_processes_externally() const override { return true; }
  std::string main_address() const override;
  int main_port() const override;
  int world_size() const override;
  int global_rank() const override;
  int local_rank() const override;
  int node_rank() const override;
  std::optional<int> launched_processes_per_node() const override;
  std::optional<int> launched_num_nodes() const override;
  std::string launch_description() const override;

 private:
  env::EnvLookup env_;
};

/// SLURM: a task of an srun step with more than one task (SLURM_STEP_ID and SLURM_PROCID set,
/// SLURM_STEP_NUM_TASKS > 1). A batch script, an salloc shell and a one-task step (srun --pty bash,
/// srun -n1 ./train) are not: there the program starts its own processes, as on a workstation.
/// Ranks from SLURM_PROCID/LOCALID/NODEID; main address MASTER_ADDR or the first host of
/// SLURM_STEP_NODELIST; port MASTER_PORT or 15000 + the last 4 digits of SLURM_JOB_ID.
class LF_API SLURMEnvironment : public ClusterEnvironment {
 public:
  explicit SLURMEnvironment(env::EnvLookup env = env::process_env());
  static bool detect(const env::EnvLookup& env);
  std::string name() const override { return "slurm"; }
  bool creates_processes_externally() const override { return true; }
  std::string main_address() const override;
  int main_port() const override;
  int world_size() const override;
  int global_rank() const override;
  int local_rank() const override;
  int node_rank() const override;
  std::optional<int> launched_processes_per_node() const override;
  std::optional<int> launched_num_nodes() const override;
  std::string launch_description() const override;

 private:
  env::EnvLookup env_;
};

/// IBM LSF / jsrun: JSM_NAMESPACE_SIZE/RANK/LOCAL_RANK; hosts from LSB_DJOB_RANKFILE (the first
/// line is the launch node and is skipped); port MASTER_PORT or 10000 + LSB_JOBID % 1000.
class LF_API LSFEnvironment : public ClusterEnvironment {
 public:
  explicit LSFEnvironment(env::EnvLookup env = env::process_env());
  static bool detect(const env::EnvLookup& env);
  std::string name() const override { return "lsf"; }
  bool creates_processes_externally() const override { return true; }
  std::string main_address() const override;
  int main_port() const override;
  int world_size() const override;
  int global_rank() const override;
  int local_rank() const override;
  int node_rank() const override;
  std::optional<int> launched_processes_per_node() const override;  // world size / compute hosts
  std::optional<int> launched_num_nodes() const override;

 private:
  std::vector<std::string> compute_hosts() const;
  env::EnvLookup env_;
};

/// mpirun: Open MPI (OMPI_COMM_WORLD_*) or PMI (PMI_RANK/PMI_SIZE, MPI_LOCALRANKID/MPI_LOCALNRANKS),
/// detected when the job has more than one process. Address: MASTER_ADDR, else 127.0.0.1 when every
/// rank runs on this node, else an error saying what to export. Port: MASTER_PORT, else, on one
/// node under a PMIx launcher (Open MPI 4+), a free port that rank 0 picks and publishes in a file
/// of the job's own session directory (PMIX_SERVER_TMPDIR), which the other ranks read: two jobs on
/// one node never share a port, and mpirun removes the file with the directory.
class LF_API MPIEnvironment : public ClusterEnvironment {
 public:
  explicit MPIEnvironment(env::EnvLookup env = env::process_env());
  static bool detect(const env::EnvLookup& env);
  std::string name() const override { return "mpi"; }
  bool creates_processes_externally() const override { return true; }
  std::string main_address() const override;
  int main_port() const override;
  int world_size() const override;
  int global_rank() const override;
  int local_rank() const override;
  int node_rank() const override;
  std::optional<int> launched_processes_per_node() const override;
  std::optional<int> launched_num_nodes() const override;
  std::string launch_description() const override;

 private:
  bool single_node() const;
  env::EnvLookup env_;
  mutable std::optional<int> published_port_;  // rank 0's pick, or what the others read
};

/// Kubeflow PyTorchJob: one process per pod; RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by the
/// operator, KUBERNETES_PORT present; node rank = RANK, local rank 0.
class LF_API KubeflowEnvironment : public ClusterEnvironment {
 public:
  explicit KubeflowEnvironment(env::EnvLookup env = env::process_env());
  static bool detect(const env::EnvLookup& env);
  std::string name() const override { return "kubeflow"; }
  bool creates_processes_externally() const override { return true; }
  std::string main_address() const override;
  int main_port() const override;
  int world_size() const override;
  int global_rank() const override;
  int local_rank() const override { return 0; }
  int node_rank() const override { return global_rank(); }
  std::optional<int> launched_processes_per_node() const override { return 1; }
  std::optional<int> launched_num_nodes() const override { return world_size(); }

 private:
  env::EnvLookup env_;
};

/// Expands a SLURM host list: "node[01-03,7],gpu5" -> node01 node02 node03 node7 gpu5.
LF_API std::vector<std::string> expand_host_list(const std::string& hosts);

/// Picks the first environment whose detect() holds, in Lightning's order: TorchElastic, SLURM,
/// LSF, MPI, Kubeflow, then the Lightning environment.
LF_API std::shared_ptr<ClusterEnvironment> detect_cluster_environment(const env::EnvLookup& env);

}  // namespace lightning::fabric
