#include "lightning/fabric/checkpoint/checkpoint_peers.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"

namespace lightning::fabric {

namespace {
// The reason action failed, or "" when it succeeded; every exception type is handled alike.
std::string failure_of(const std::function<void()>& action) {
  std::string failure;
  try {
    action();
    return failure;
  } catch (const c10::Error& error) {
    failure = error.what_without_backtrace();
  } catch (const std::exception& error) {
    failure = error.what();
  } catch (...) {
    failure = "an exception that is not a std::exception";
  }
  return failure.empty() ? "an exception without a message" : failure;
}
}  // namespace

CheckpointPeers::CheckpointPeers(Collective& group)
    : rank_(group.rank()), world_size_(group.world_size()), group_(&group),
      broadcast_bytes_([&group](const std::string& bytes, int src) { return group.broadcast_bytes(bytes, src); }),
      min_over_ranks_([&group](int value) {
        at::Tensor mine = at::full({1}, static_cast<double>(value), at::TensorOptions().dtype(at::kDouble));
        group.all_reduce_(mine, ReduceOp::Min);
        return static_cast<int>(mine.item<double>());
      }) {}

CheckpointPeers::CheckpointPeers(int rank, int world_size,
                                 std::function<std::string(const std::string&, int)> broadcast_bytes,
                                 std::function<int(int)> min_over_ranks)
    : rank_(rank), world_size_(world_size), broadcast_bytes_(std::move(broadcast_bytes)),
      min_over_ranks_(std::move(min_over_ranks)) {}

void CheckpointPeers::all_reduce_sum_(at::Tensor& tensor) const {
  LF_CHECK(group_ != nullptr, RuntimeError, "CheckpointPeers: a sum over the ranks needs their process group.");
  group_->all_reduce_(tensor, ReduceOp::Sum);
}

std::vector<std::string> CheckpointPeers::gather_bytes(const std::string& bytes, bool everywhere) const {
  if (group_ != nullptr) return group_->gather_bytes(bytes, everywhere ? -1 : 0);
  std::vector<std::string> every_rank;
  for (int rank = 0; rank < world_size_; ++rank) {
    std::string theirs = broadcast_bytes(rank == rank_ ? bytes : std::string(), rank);
    if (everywhere || is_global_zero()) every_rank.push_back(std::move(theirs));
  }
  return every_rank;
}

void CheckpointPeers::run_on_rank_zero(const std::string& call, const std::function<void()>& action) const {
  std::string failure = is_global_zero() ? failure_of(action) : std::string();
  failure = broadcast_bytes(failure, 0);
  LF_CHECK(failure.empty(), RuntimeError, call, " failed on rank 0: ", failure);
}

void CheckpointPeers::run_on_every_rank(const std::string& call, const std::function<void()>& action) const {
  std::string failure = failure_of(action);
  const int first = min_over_ranks_(failure.empty() ? world_size_ : rank_);
  if (first >= world_size_) return;
  failure = broadcast_bytes(failure, first);
  throw RuntimeError(call + " failed on rank " + std::to_string(first) + ": " + failure);
}

}  // namespace lightning::fabric
