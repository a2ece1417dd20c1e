// Subgroups of a job's ranks for Fabric's collectives (Python's torch.distributed.new_group, as
// Lightning's TorchCollective.new_group): made by Fabric::new_group on every rank, used by the
// members only.
//   auto pair = fabric.new_group({0, 1});
//   if (pair->is_member()) total = fabric.all_reduce(x, "sum", *pair);
//   auto rows = fabric.all_gather(z, AllGatherOptions().in(pair).with_gradients());
#pragma once

#include "lightning/fabric/export.h"

#include <memory>
#include <vector>

namespace lightning::fabric {

class Collective;

class LF_API ProcessGroup {
 public:
  /// ranks: the members' global ranks, ascending; rank: this process's position among them, or
  /// -1; collective: the members' communicator (null for a non-member and for a single process).
  ProcessGroup(std::vector<int> ranks, int rank, std::shared_ptr<Collective> collective);
  ~ProcessGroup();

  /// The members' global ranks, in group-rank order (ascending).
  const std::vector<int>& ranks() const { return ranks_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  /// This process's rank in the group; -1 when it is not a member.
  int rank() const { return rank_; }
  bool is_member() const { return rank_ >= 0; }
  /// The members' communicator; ValueError naming `call`, this rank and the members when this
  /// process is not one of them. Null for a group of one process (nothing to communicate).
  Collective* communicator(const char* call, int global_rank) const;
  /// The group rank of a member's global rank; ValueError naming `call` otherwise.
  int group_rank_of(int global_rank, const char* call) const;

 private:
  std::vector<int> ranks_;
  int rank_;
  std::shared_ptr<Collective> collective_;
};

/// Fabric::all_gather's options: Python's group= and sync_grads=.
struct LF_API AllGatherOptions {
  /// The ranks to gather from; null: every rank.
  std::shared_ptr<ProcessGroup> group;
  /// Let gradients flow back through the gather (Python's sync_grads=True): each rank's input
  /// receives the sum over the members of the gradient of its slice. Floating tensors only.
  bool sync_grads = false;

  AllGatherOptions& in(std::shared_ptr<ProcessGroup> value) { group = std::move(value); return *this; }
  AllGatherOptions& with_gradients(bool on = true) { sync_grads = on; return *this; }
};

}  // namespace lightning::fabric
