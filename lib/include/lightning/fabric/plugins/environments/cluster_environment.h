// Cluster environments: where a process learns its rank, the world size and the main address.
// Detected in Lightning's order (TorchElastic, SLURM, LSF, MPI, then Lightning's own); the
// Lightning environment with no rank variables means "not launched": Fabric::launch() may spawn.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric/plugins/plugin.h"
#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric {

class ClusterEnvironment : public Plugin {
 public:
  /// True when something else (a launcher, the scheduler) created this process per rank.
  virtual bool creates_processes_externally() const = 0;
  virtual std::string main_address() const = 0;
  virtual int main_port() const = 0;
  virtual int world_size() const = 0;
  virtual int global_rank() const = 0;
  virtual int local_rank() const = 0;
  virtual int node_rank() const = 0;
  /// Called by the Connector with the world size it computed from devices x num_nodes; an
  /// environment whose variables say otherwise reports the mismatch.
  virtual void validate_settings(int num_devices, int num_nodes) const {
    (void)num_devices;
    (void)num_nodes;
  }
  /// How many processes the external launcher started on this node, when its variables say so:
  /// devices "auto" resolves to this count (one device per process), so a program started by
  /// torchrun, srun or mpirun needs no devices flag. nullopt: not launched externally, or unknown.
  virtual std::optional<int> launched_processes_per_node() const { return std::nullopt; }
  /// The Lightning environment learns its rank from the strategy; others ignore these.
  virtual void set_world_size(int size) { (void)size; }
  virtual void set_global_rank(int rank) { (void)rank; }
};

/// Lightning's own: MASTER_ADDR/MASTER_PORT/NODE_RANK/LOCAL_RANK; ranks from the strategy when
/// the process was not launched externally.
class LightningEnvironment : public ClusterEnvironment {
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
class TorchElasticEnvironment : public ClusterEnvironment {
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
  void validate_settings(int num_devices, int num_nodes) const override;
  std::optional<int> launched_processes_per_node() const override;

 private:
  env::EnvLookup env_;
};

/// SLURM (srun): SLURM_NTASKS/PROCID/LOCALID/NODEID; main address MASTER_ADDR or the first host
/// of SLURM_NODELIST; port MASTER_PORT or 15000 + the last 4 digits of SLURM_JOB_ID. Not detected
/// in an interactive allocation (SLURM_JOB_NAME bash or interactive).
class SLURMEnvironment : public ClusterEnvironment {
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
  void validate_settings(int num_devices, int num_nodes) const override;
  std::optional<int> launched_processes_per_node() const override;

 private:
  env::EnvLookup env_;
};

/// IBM LSF / jsrun: JSM_NAMESPACE_SIZE/RANK/LOCAL_RANK; hosts from LSB_DJOB_RANKFILE (the first
/// line is the launch node and is skipped); port MASTER_PORT or 10000 + LSB_JOBID % 1000.
class LSFEnvironment : public ClusterEnvironment {
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

 private:
  std::vector<std::string> compute_hosts() const;
  env::EnvLookup env_;
};

/// mpirun: Open MPI (OMPI_COMM_WORLD_*) or PMI (PMI_RANK/PMI_SIZE, MPI_LOCALRANKID/MPI_LOCALNRANKS).
/// MPI has no rendezvous address of its own here: MASTER_ADDR (default 127.0.0.1) and MASTER_PORT
/// must be exported to every rank (mpirun -x MASTER_ADDR -x MASTER_PORT).
class MPIEnvironment : public ClusterEnvironment {
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

 private:
  env::EnvLookup env_;
};

/// Kubeflow PyTorchJob: one process per pod; RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by the
/// operator, KUBERNETES_PORT present; node rank = RANK, local rank 0.
class KubeflowEnvironment : public ClusterEnvironment {
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

 private:
  env::EnvLookup env_;
};

/// Expands a SLURM host list: "node[01-03,7],gpu5" -> node01 node02 node03 node7 gpu5.
std::vector<std::string> expand_host_list(const std::string& hosts);

/// Picks the first environment whose detect() holds, in Lightning's order: TorchElastic, SLURM,
/// LSF, MPI, Kubeflow, then the Lightning environment.
std::shared_ptr<ClusterEnvironment> detect_cluster_environment(const env::EnvLookup& env);

}  // namespace lightning::fabric
