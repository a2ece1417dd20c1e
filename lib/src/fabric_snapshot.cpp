// Fabric::snapshot and Fabric::restore_snapshot: the job's newest state kept in the memory of its
// node's lightning-run (--in-memory-replicas K), as a checkpoint under memory://snapshot-N.
#include "lightning/fabric/fabric.h"

#include <cstdio>
#include <cstdlib>

#include "lightning/fabric/checkpoint/resume.h"
#include "lightning/fabric/connector.h"
#include "lightning/fabric/storage/node_memory.h"
#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric {

namespace {
constexpr const char* kSnapshotPrefix = "snapshot-";
// The entry snapshot() adds when the State has no fabric.resume_state() of its own.
constexpr const char* kSnapshotResumeEntry = "fabric_resume";

std::string snapshot_name(int64_t number) {
  char name[40];
  std::snprintf(name, sizeof(name), "%s%012lld", kSnapshotPrefix, static_cast<long long>(number));
  return name;
}

// The number of the newest whole snapshot in `store`: a file snapshot-N (one writer) or a folder
// snapshot-N holding .metadata (sharded: written last); -1 when there is none.
int64_t newest_whole_snapshot(const storage::ObjectStore& store) {
  int64_t newest = -1;
  const std::string prefix = kSnapshotPrefix;
  for (const auto& [name, size] : store.list_folder("")) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash + 1) != ".metadata") continue;
    const std::string digits = name.substr(prefix.size(), slash == std::string::npos ? std::string::npos : slash - prefix.size());
    char* end = nullptr;
    const long long number = std::strtoll(digits.c_str(), &end, 10);
    if (end != nullptr && *end == '\0' && number > newest) newest = number;
  }
  return newest;
}
}  // namespace

int64_t Fabric::snapshot_interval() {
  if (snapshot_every_ >= 0) return snapshot_every_;
  const char* value = std::getenv(env::kInMemoryReplicas);
  const char* memory = std::getenv(env::kNodeMemory);
  if (value == nullptr || *value == '\0' || memory == nullptr || *memory == '\0') return snapshot_every_ = 0;
  char* end = nullptr;
  const long long every = std::strtoll(value, &end, 10);
  LF_CHECK(end != nullptr && *end == '\0' && every >= 1, ValueError, env::kInMemoryReplicas, "='", value,
           "' is not a whole number of steps of at least 1; lightning-run --in-memory-replicas K sets it");
  snapshot_every_ = every;
  return snapshot_every_;
}

State Fabric::with_snapshot_resume(const State& state, const char* call) {
  if (!resume::entry_names(state, *this, call).empty()) return state;
  State with = state;
  with.insert_or_assign(kSnapshotResumeEntry, StateEntry(resume_state()));
  return with;
}

bool Fabric::snapshot(const State& state) {
  if (snapshot_interval() == 0) return false;
  ++snapshot_calls_;
  if (snapshot_calls_ % snapshot_every_ != 0) return false;
  const std::string name = snapshot_name(snapshot_calls_);
  ensure_environment_ready();
  // The snapshot before this one completes first (raising its failure on every rank), so that one
  // whole snapshot is always held while this one is written.
  connector_->strategy->settle_background_save(/*wait=*/true);
  // The node's ranks share one store: its local rank 0 drops the snapshots before this one but the
  // newest whole one (names sort by number; this one's parts, which other ranks may be putting
  // already, sort after them).
  // A failure there is raised on every rank alike, so none waits for it in the save.
  connector_->strategy->run_on_every_rank("fabric.snapshot", [&] {
    if (local_rank() != 0) return;
    const auto store = storage::NodeMemoryClient::from_environment("fabric.snapshot");
    const std::string keep = snapshot_name(newest_whole_snapshot(*store));
    for (const auto& [key, size] : store->list_folder("")) {
      if (key.rfind(kSnapshotPrefix, 0) == 0 && key < name && key != keep && key.rfind(keep + "/", 0) != 0) store->remove(key);
    }
  });
  const State with = with_snapshot_resume(state, "fabric.snapshot");
  const std::optional<State> resolved = with_resume_values(with, "fabric.snapshot");
  // As fabric.save_in_background: returns once the state is copied; the files are written into the
  // node's memory meanwhile, and the snapshot is whole once every rank's part is in (its .metadata
  // or its one file last) at the next collective call.
  connector_->strategy->save_checkpoint("memory://" + name, resolved ? *resolved : with, {}, /*in_background=*/true);
  return true;
}

bool Fabric::restore_snapshot(State& state) {
  if (snapshot_interval() == 0) return false;
  ensure_environment_ready();
  const auto store = storage::NodeMemoryClient::from_environment("fabric.restore_snapshot");
  const int64_t mine = newest_whole_snapshot(*store);
  int64_t oldest = mine, newest = mine;
  if (world_size() > 1) {
    // One all-reduce of (-mine, mine) by max: -oldest and newest (all_reduce works in place).
    const at::Tensor both = at::tensor({-static_cast<double>(mine), static_cast<double>(mine)}, at::kDouble);
    const at::Tensor reduced = all_reduce(both, "max");
    oldest = -static_cast<int64_t>(reduced[0].item<double>());
    newest = static_cast<int64_t>(reduced[1].item<double>());
  }
  LF_CHECK(oldest == newest, RuntimeError, "fabric.restore_snapshot: the nodes hold different newest snapshots (",
           oldest, " to ", newest, "; -1: none): the state of some ranks was lost. Restart from a checkpoint on disk.");
  if (newest < 0) return false;
  const std::string path = "memory://" + snapshot_name(newest);
  State with = with_snapshot_resume(state, "fabric.restore_snapshot");
  load(path, with, /*strict=*/true);
  for (auto& [name, entry] : state) {
    if (entry.kind() == StateEntry::Kind::Value) entry.set_value(with.at(name).value());
  }
  snapshot_calls_ = newest;
  return true;
}

}  // namespace lightning::fabric
