// The ranks a checkpoint is saved or loaded by, and the protocol every step of it runs under
// (collective; each step is also a barrier): an action on rank 0 only, or on every rank, whose
// failure on any rank (c10::Error, std::exception, anything) becomes the same RuntimeError on
// every rank, "<call> failed on rank R: <why>", so no rank goes on while another lost the file.
// The sharded-checkpoint engine runs it over a process group; Strategy::run_on_rank_zero and
// run_on_every_rank over a strategy's own collectives (one process included).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace lightning::fabric {

class Collective;

class CheckpointPeers {
 public:
  /// The ranks of group (which must outlive every copy of this).
  explicit CheckpointPeers(Collective& group);
  /// Ranks reached through other collectives: broadcast_bytes(bytes, src) and the minimum of an
  /// integer over the ranks.
  CheckpointPeers(int rank, int world_size, std::function<std::string(const std::string&, int)> broadcast_bytes,
                  std::function<int(int)> min_over_ranks);

  int global_rank() const { return rank_; }
  int world_size() const { return world_size_; }
  bool is_global_zero() const { return rank_ == 0; }
  std::string broadcast_bytes(const std::string& bytes, int src) const { return broadcast_bytes_(bytes, src); }
  /// Every rank's bytes in rank order on rank 0 (empty elsewhere), or on every rank when
  /// everywhere: two collectives over a group, one broadcast per rank otherwise.
  std::vector<std::string> gather_bytes(const std::string& bytes, bool everywhere = false) const;
  /// Sums tensor over the ranks in place (a group's peers only; RuntimeError otherwise).
  void all_reduce_sum_(at::Tensor& tensor) const;

  void run_on_rank_zero(const std::string& call, const std::function<void()>& action) const;
  void run_on_every_rank(const std::string& call, const std::function<void()>& action) const;

 private:
  int rank_ = 0, world_size_ = 1;
  Collective* group_ = nullptr;
  std::function<std::string(const std::string&, int)> broadcast_bytes_;
  std::function<int(int)> min_over_ranks_;
};

}  // namespace lightning::fabric
