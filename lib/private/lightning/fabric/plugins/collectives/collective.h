// A c10d process group for one job: gloo for CPU tensors, NCCL for CUDA tensors when the LibTorch
// has it. Created from the torchrun contract: with TORCHELASTIC_USE_AGENT_STORE=True every rank
// joins the launcher's TCPStore as a client; otherwise rank 0 hosts the store at
// MASTER_ADDR:MASTER_PORT (or uses one it already hosts). Every method is collective: all ranks
// call it in the same order.
//
// Devices: a group moves tensors of one device, device(): the CPU for gloo, this rank's GPU for
// nccl (ProcessGroupNCCL rejects CPU tensors at any world size). Every method below takes tensors
// on any device: a tensor already on device() is used in place, any other is staged through
// device() (one copy there, one back) and the result lands on the caller's tensor as documented.
// The only exception is all_reduce_start_, which must get a tensor on device().
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric/reduce_op.h"
#include "lightning/fabric/utilities/env_vars.h"

namespace c10d {
class Store;
}

namespace lightning::fabric {

struct CollectiveOptions {
  std::string main_address = "127.0.0.1";
  int main_port = 29400;
  int rank = 0;
  int world_size = 1;
  int restart_count = 0;                 // store prefix /worker/attempt_<N>, as torchrun
  bool use_agent_store = false;          // join a launcher's store instead of hosting on rank 0
  /// "gloo" | "nccl" | "shm" (CPU, every rank on one machine) | "cpu-auto": shm when every rank
  /// turns out to be on this machine (compared through the store), else gloo.
  std::string backend = "gloo";
  at::Device device = at::kCPU;          // the group's device: this rank's GPU for nccl
  std::chrono::milliseconds timeout = std::chrono::minutes(30);             // of every collective
  std::chrono::milliseconds rendezvous_timeout = std::chrono::minutes(5);    // for all ranks to arrive
  // Hang detection (docs/launcher.md, "When a job hangs"); apply_watch_environment reads these.
  std::chrono::milliseconds hang_timeout = std::chrono::minutes(5);  // a rank blocked this long = hang; 0 = off
  uint32_t flight_records = 2048;   // the flight recorder's ring; 0 = no recorder and no watchdog
  std::string flight_dir;           // LT_FLIGHT_DIR: recorder files there, read by lightning-run
  std::string hang_dump_dir;        // LT_HANG_DUMP_DIR: where dumps go (default: rank 0 picks)
  std::string error_file;           // TORCHELASTIC_ERROR_FILE: rank 0's hang report goes there too
  bool check_collectives = false;   // compare op, dtype and shape across ranks before every collective
};

/// Overrides options' hang settings from the environment (through env::Reader): LT_HANG_TIMEOUT
/// (seconds, 0 = off), LT_FLIGHT_RECORDS, LT_FLIGHT_DIR, LT_HANG_DUMP_DIR, LT_CHECK_COLLECTIVES (a
/// flag: 1/0, true/false, yes/no), TORCHELASTIC_ERROR_FILE. Throws ValueError naming a bad value
/// and what is valid.
void apply_watch_environment(const env::EnvLookup& env, CollectiveOptions& options);

class Collective {
 public:
  /// Creates the process group. Also installs this process's flight recorder and starts the hang
  /// watchdog (world size > 1; see flight_recorder.h and options.hang_timeout). store: a server store this process already hosts (Fabric::launch
  /// creates it before spawning, so the port is known without a race); null = as options say.
  /// Collective: every rank first announces itself in the store and waits for the others up to
  /// options.rendezvous_timeout; then a RuntimeError names the ranks that never arrived.
  explicit Collective(const CollectiveOptions& options, c10::intrusive_ptr<c10d::Store> store = {});
  /// A group of some of parent's ranks (collective over those ranks: each calls it with the same
  /// name and rank list, in the same order). This process's rank in it is its position in ranks.
  /// backend: the parent's when empty, else "gloo" or "shm" (CPU groups).
  Collective(const Collective& parent, const std::string& name, const std::vector<int>& ranks,
             const std::string& backend = "");
  ~Collective();
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  int rank() const;
  /// Collective operations issued so far (tests check that a no-sync backward issues none).
  uint64_t operation_count() const;
  int world_size() const;
  const std::string& backend() const;
  /// The device this group communicates on (see the top of this header).
  at::Device device() const;

  void barrier();
  /// In place on a tensor of any device (Mean is c10d's AVG, on gloo and nccl alike).
  void all_reduce_(at::Tensor& tensor, ReduceOp op);
  /// Several tensors in flight at once, then waited for (bucketed gradient averaging).
  void all_reduce_many_(std::vector<at::Tensor>& tensors, ReduceOp op);
  /// Starts a sum all-reduce of tensor (which must be on device()) in place and returns a function
  /// that waits for it.
  std::function<void()> all_reduce_start_(at::Tensor& tensor);
  /// A new tensor, on tensor's device, with a leading world-size dimension. Empty tensors work.
  at::Tensor all_gather(const at::Tensor& tensor);
  /// Reduce-scatter (sum): rows is [world_size, n]; returns the sum over ranks of their row r, on
  /// rank r, on rows' device. Moves (N-1)/N of the data, half of an all-reduce.
  at::Tensor reduce_scatter_rows(const at::Tensor& rows);
  /// In place on a contiguous tensor of any device.
  void broadcast_(at::Tensor& tensor, int src);
  /// Equal-split all-to-all: tensor's elements in world_size equal parts, part p goes to rank p;
  /// returns, in rank order, the part each rank sent to this one (a new tensor, tensor's device).
  at::Tensor all_to_all(const at::Tensor& tensor);
  /// src's bytes on every rank (the size first, then the bytes, both through device()).
  std::string broadcast_bytes(const std::string& bytes, int src);
  /// Checks that every rank passes tensors of the same count, dtypes and shapes (one small
  /// all_gather); a ValueError naming `what` and each rank's count and elements otherwise, on
  /// every rank. Strategies call it before broadcasting a model at setup.
  void check_same_tensors(const std::vector<at::Tensor>& tensors, const std::string& what);

 private:
  void create_group();
  void start_watch(const c10::intrusive_ptr<c10d::Store>& hosted);
  void check_call(int op, const at::Tensor* tensor);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Hosts the store a job's ranks will join: a TCPStore server on host:port (0 = a free port).
c10::intrusive_ptr<c10d::Store> host_store(const std::string& host, int port, std::chrono::milliseconds timeout, int* bound_port);

}  // namespace lightning::fabric
