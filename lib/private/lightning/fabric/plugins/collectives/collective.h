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

#include "lightning/fabric/plugins/collectives/process_group_settings.h"
#include "lightning/fabric/reduce_op.h"

namespace c10d {
class Backend;
class Store;
class Work;
}  // namespace c10d

namespace lightning::fabric {

struct CollectiveOptions {
  std::string main_address = "127.0.0.1";
  int main_port = 29400;
  int rank = 0;
  int world_size = 1;
  int store_attempt = 0;                 // store prefix /worker/attempt_<N>: LT_ATTEMPT, else the restart count (torchrun)
  bool use_agent_store = false;          // join a launcher's store instead of hosting on rank 0
  /// With use_agent_store: reach that store through this node's store relay (LT_STORE_RELAY,
  /// internal/store_relay.h) instead of a connection of this rank's own; empty: connect directly.
  std::string store_relay;
  int local_world_size = 1;              // ranks on this node (the relay's share of the store's clients)
  ProcessGroupBackend backend = ProcessGroupBackend::Gloo;
  /// With backend Gloo: after a vote through the store as the group forms, use shm when every
  /// rank is on this machine, shm+gloo when the ranks are on several machines with at least 2 on
  /// each and the same number on every one. ParallelStrategy sets it for CPU jobs that name no
  /// backend.
  bool shm_within_hosts = false;
  at::Device device = at::kCPU;          // the group's device: this rank's GPU for nccl
  /// Timeouts, hang detection and gloo's interface, as they stand after the environment
  /// (with_environment_overrides). settings.backend is not read here: backend above is the choice.
  ProcessGroupSettings settings;
};

class Collective {
 public:
  /// Creates the process group. Also installs this process's flight recorder and starts the hang
  /// watchdog (world size > 1; lightning/fabric/hang/hang_watchdog.h). store: a server store this
  /// process already hosts (Fabric::launch creates it before spawning, so the port is known
  /// without a race); null = as options say. Collective: every rank first announces itself in
  /// the store and waits for the others up to options.settings.rendezvous_timeout; then a
  /// RuntimeError names the ranks that never arrived (collective_rendezvous.h).
  explicit Collective(const CollectiveOptions& options, c10::intrusive_ptr<c10d::Store> store = {});
  /// A group of some of parent's ranks (collective over those ranks: each calls it with the same
  /// name and rank list, in the same order). This process's rank in it is its position in ranks.
  /// backend: Gloo or Shm (CPU groups); unset, the parent's, except under shm+gloo, where the
  /// subgroup's own host vote decides (shm on one host, shm+gloo on several with the same count of
  /// at least 2, else gloo).
  Collective(const Collective& parent, const std::string& name, const std::vector<int>& ranks,
             std::optional<ProcessGroupBackend> backend = std::nullopt);
  ~Collective();
  Collective(const Collective&) = delete;
  /// base + "-<k>", k counting this group's earlier calls: names for subgroups that every rank
  /// builds in the same order, so that two builds (two meshes) never share store keys. Not collective.
  std::string next_group_name(const std::string& base);
  Collective& operator=(const Collective&) = delete;

  int rank() const;
  /// Collective operations issued so far (tests check that a no-sync backward issues none).
  uint64_t operation_count() const;
  int world_size() const;
  ProcessGroupBackend backend() const;
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
  /// all_gather started now and finished by the returned function, which waits and returns the
  /// result (call it exactly once, before the group is gone). Other ops may be issued meanwhile;
  /// every rank must issue the same ops in the same order. On shm the gather runs on the group's
  /// background thread (shm_backend.h), on gloo and nccl in their own.
  std::function<at::Tensor()> all_gather_start(const at::Tensor& tensor);
  /// In place on a contiguous tensor of any device.
  void broadcast_(at::Tensor& tensor, int src);
  /// broadcast_ of many tensors (any layout and dtype) in few operations: consecutive tensors on
  /// one device are packed as bytes into one buffer of at most bucket_bytes (a larger tensor goes
  /// alone), broadcast, and copied back in place. Every rank passes the same dtypes and shapes.
  void broadcast_many_(const std::vector<at::Tensor>& tensors, int src, size_t bucket_bytes);
  /// Equal-split all-to-all: tensor's elements in world_size equal parts, part p goes to rank p;
  /// returns, in rank order, the part each rank sent to this one (a new tensor, tensor's device).
  at::Tensor all_to_all(const at::Tensor& tensor);
  /// Point-to-point (blocking, as torch.distributed.send/recv): tensor's elements to group rank
  /// dst; recv_ fills tensor (any device, staged like broadcast_) from group rank src. On shm the
  /// bytes go through a shared-memory ring of the pair, made by their first send/recv.
  void send(const at::Tensor& tensor, int dst);
  void recv_(at::Tensor& tensor, int src);
  /// Point-to-point started now and finished by the returned function, which waits for it (call it
  /// exactly once, before the group is gone). tag (>= 0) separates streams between one pair:
  /// messages of one tag arrive in the order sent. tensor must be contiguous and on device(); it
  /// must stay alive and unchanged (send) or untouched (recv) until the wait returns. Recorded in
  /// the flight recorder like every op, so the hang watchdog sees a rank stuck in one.
  std::function<void()> send_start(const at::Tensor& tensor, int dst, int tag);
  std::function<void()> recv_start_(at::Tensor& tensor, int src, int tag);
  /// Makes the point-to-point connection to each peer now (on shm: the pair rings that the first
  /// send or recv would make, without waiting on the peer; gloo and nccl connect in the group).
  void connect_point_to_point(const std::vector<int>& peers);
  /// The op's result on group rank dst (a new tensor, tensor's device); tensor unchanged
  /// elsewhere, which get tensor back. Mean: the sum divided by the group's size.
  at::Tensor reduce(const at::Tensor& tensor, int dst, ReduceOp op);
  /// On group rank dst every rank's tensor stacked in a new leading dimension of world size; an
  /// undefined tensor elsewhere.
  at::Tensor gather(const at::Tensor& tensor, int dst);
  /// Fills output with rows[r] on group rank r: rows is [world_size, output's shape] on src,
  /// unused (may be undefined) elsewhere. Returns output.
  at::Tensor& scatter_(at::Tensor& output, const at::Tensor& rows, int src);
  /// rows is [world_size, ...]: returns the op over ranks of their row r on rank r (row's shape,
  /// rows' device). Sum moves (N-1)/N of the data, half of an all-reduce.
  at::Tensor reduce_scatter(const at::Tensor& rows, ReduceOp op);
  /// Checks that every rank of the group calls `call` with a tensor of the same dtype and shape
  /// (one small all_gather); a ValueError naming `call`, each rank's dtype and shape, and the fix
  /// otherwise, on every rank. Fabric::all_gather runs it before gathering.
  void check_same_shapes(const std::string& call, const at::Tensor& tensor);
  /// src's bytes on every rank (the size first, then the bytes, both through device()).
  std::string broadcast_bytes(const std::string& bytes, int src);
  /// Every rank's bytes, in rank order, on group rank dst (empty elsewhere), or on every rank for
  /// dst -1: two collectives whatever the group's size (the longest length, then one gather of
  /// length-prefixed rows).
  std::vector<std::string> gather_bytes(const std::string& bytes, int dst);
  /// Checks that every rank passes tensors of the same count, dtypes and shapes (one small
  /// all_gather); a ValueError naming `what` and each rank's count and elements otherwise, on
  /// every rank. Strategies call it before broadcasting a model at setup.
  void check_same_tensors(const std::vector<at::Tensor>& tensors, const std::string& what);

 private:
  void create_group();
  /// One blocking op: counted, recorded as op with tensor's dtype and shape (flight recorder and
  /// profiler), compared across ranks by check_call (except point-to-point), issued and waited for.
  void run_blocking(int op, const at::Tensor* tensor, const std::function<c10::intrusive_ptr<c10d::Work>()>& issue);
  void check_call(int op, const at::Tensor* tensor);
  /// check_call's comparison, run whatever check_collectives says; `call` names the caller's API
  /// in the error (empty: the generic LT_CHECK_COLLECTIVES message).
  void compare_calls(int op, const at::Tensor* tensor, const std::string& call);
  /// send_start and recv_start_ (op kSend or kRecv): checked, recorded, issued.
  std::function<void()> start_point_to_point(int op, const at::Tensor& tensor, int peer, int tag);
  /// Issues a point-to-point op with peer (a rank of this group) on this group's backend.
  c10::intrusive_ptr<c10d::Work> point_to_point(int peer,
                                                const std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&, int)>& issue);
  /// Counts, records and checks (check_collectives; not point-to-point, which only the peer takes
  /// part in) an op about to be issued asynchronously;
  /// returns its flight record (0 without a recorder), ended as failed when the check throws.
  uint64_t begin_async(int op, const at::Tensor& tensor);
  /// Counts, records, checks (check_collectives) and issues one all-reduce of work, which is on
  /// device(); seq receives its flight record (0 without a recorder). A check or issue that fails
  /// ends the record as failed.
  c10::intrusive_ptr<c10d::Work> issue_all_reduce(at::Tensor& work, ReduceOp op, uint64_t& seq);
  /// Waits for an issued op under the recorder: marks the rank waiting, ends the record (failed
  /// when the wait throws, and rethrows).
  void wait_recorded(const c10::intrusive_ptr<c10d::Work>& work, uint64_t seq) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Hosts the store a job's ranks will join: a TCPStore server on host:port (0 = a free port).
c10::intrusive_ptr<c10d::Store> host_store(const std::string& host, int port, std::chrono::milliseconds timeout, int* bound_port);

}  // namespace lightning::fabric
