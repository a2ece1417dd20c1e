#include "lightning/fabric/process_group.h"

#include <sstream>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"

namespace lightning::fabric {

namespace {
std::string member_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << "[";
  if (ranks.size() > 3 && ranks.back() - ranks.front() + 1 == static_cast<int>(ranks.size())) {
    out << ranks.front() << ".." << ranks.back() << "]";  // every rank between: the world, a node
    return out.str();
  }
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  out << "]";
  return out.str();
}
}  // namespace

ProcessGroup::ProcessGroup(std::vector<int> ranks, int rank, std::shared_ptr<Collective> collective)
    : ranks_(std::move(ranks)), rank_(rank), collective_(std::move(collective)) {}

ProcessGroup::~ProcessGroup() = default;

Collective* ProcessGroup::communicator(const char* call, int global_rank) const {
  LF_CHECK(rank_ >= 0, ValueError, call, ": this process (global rank ", global_rank, ") is not in the group of ranks ",
           member_list(ranks_), ". Only the members call a group's collectives (as with torch.distributed): guard the call "
           "with `if (group->is_member())`.");
  return collective_.get();
}

int ProcessGroup::group_rank_of(int global_rank, const char* call) const {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] == global_rank) return static_cast<int>(i);
  }
  LF_CHECK(false, ValueError, call, ": rank ", global_rank, " is not in the group of ranks ", member_list(ranks_),
           "; name one of its members (a global rank).");
  return -1;
}

}  // namespace lightning::fabric
