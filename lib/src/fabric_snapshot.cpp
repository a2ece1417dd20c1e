// Fabric::snapshot and Fabric::restore_snapshot: the job's newest state kept in the memory of its
// node's lightning-run (--in-memory-replicas K), as a checkpoint under memory://snapshot-N.
#include "lightning/fabric/fabric.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "lightning/fabric/checkpoint/dcp_format.h"
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

// Put on every node once a snapshot is whole and copied everywhere: a job that finds no whole
// snapshot but this marker lost one (never a silent start from scratch).
constexpr const char* kSnapshotsBegan = "snapshots-began";
// How long snapshot() waits for the previous snapshot's copy to the buddy node.
constexpr double kCopyTimeoutS = 600;

// The snapshots the listing holds, by number: for each, the names of its objects ("" for a file
// snapshot-N, else the names under the folder).
std::map<int64_t, std::set<std::string>> snapshots_in(const std::map<std::string, int64_t>& listing) {
  std::map<int64_t, std::set<std::string>> found;
  const std::string prefix = kSnapshotPrefix;
  for (const auto& [name, size] : listing) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t slash = name.find('/');
    const std::string digits = name.substr(prefix.size(), slash == std::string::npos ? std::string::npos : slash - prefix.size());
    char* end = nullptr;
    const long long number = std::strtoll(digits.c_str(), &end, 10);
    if (end == nullptr || *end != '\0' || digits.empty()) continue;
    found[number].insert(slash == std::string::npos ? std::string() : name.substr(slash + 1));
  }
  return found;
}

// Why snapshot `number` cannot be restored from `store` ("" when it is whole: a file, or a folder
// whose .metadata is there with every data file it names).
std::string snapshot_gap(const storage::ObjectStore& store, int64_t number, const std::set<std::string>& names) {
  if (names.count("")) return "";
  if (!names.count(".metadata")) return "its .metadata (written last) is missing";
  const std::string folder = snapshot_name(number);
  const dcp::Metadata metadata = dcp::parse_metadata(store.get(folder + "/.metadata"), "memory://" + folder + "/.metadata");
  std::set<std::string> missing;
  for (const auto& [key, item] : metadata.items) {
    for (const auto& location : item.locations)
      if (!names.count(location.file)) missing.insert(location.file);
  }
  if (missing.empty()) return "";
  std::string text = "its parts ";
  for (const auto& file : missing) text += (text.size() > 10 ? ", " : "") + file;
  return text + " are on no node that answered";
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
  // The previous snapshot is whole now; it survives the loss of any one node once every node has
  // copied its part to its buddy. Only then do the nodes drop the ones before it (each its own
  // objects and the copies it holds), so one whole, copied snapshot is always held. A failure
  // there is raised on every rank alike, so none waits for it in the save.
  const int64_t previous = snapshot_calls_ - snapshot_every_;
  connector_->strategy->run_on_every_rank("fabric.snapshot", [&] {
    if (local_rank() == 0) storage::NodeMemoryClient::from_environment("fabric.snapshot")->wait_until_copied(kCopyTimeoutS);
  });
  connector_->strategy->run_on_every_rank("fabric.snapshot", [&] {
    if (local_rank() != 0 || previous < 1) return;
    const auto store = storage::NodeMemoryClient::from_environment("fabric.snapshot");
    store->drop_before(kSnapshotPrefix, snapshot_name(previous));
    store->put(kSnapshotsBegan, std::to_string(previous));
  });
  const State with = with_snapshot_resume(state, "fabric.snapshot");
  const std::optional<State> resolved = with_resume_values(with, "fabric.snapshot");
  // As fabric.save_in_background: returns once the state is copied; the files are written into the
  // node's memory meanwhile, and the snapshot is whole once every rank's part is in (its .metadata
  // or its one file last) at the next collective call.
  connector_->strategy->save_checkpoint("memory://" + name, resolved ? *resolved : with, {}, /*in_background=*/true);
  return true;
}

bool Fabric::restore_snapshot(State& state, const std::string& fallback_checkpoint) {
  if (snapshot_interval() == 0) return false;
  ensure_environment_ready();
  const auto store = storage::NodeMemoryClient::from_environment("fabric.restore_snapshot");
  // What every node that answers holds (this node's lightning-run asks the others).
  const auto snapshots = snapshots_in(store->list_folder(""));
  int64_t mine = -1;
  std::string lost;
  for (auto it = snapshots.rbegin(); it != snapshots.rend() && mine < 0; ++it) {
    const std::string gap = snapshot_gap(*store, it->first, it->second);
    if (gap.empty()) {
      mine = it->first;
    } else {
      lost += (lost.empty() ? "" : "; ") + ("snapshot " + std::to_string(it->first) + ": " + gap);
    }
  }
  const bool began = mine < 0 && store->exists(kSnapshotsBegan);
  int64_t oldest = mine, newest = mine;
  double any_began = began ? 1 : 0;
  if (world_size() > 1) {
    // One all-reduce by max: -oldest, newest, and whether any rank knows snapshots were taken.
    const at::Tensor all = at::tensor({-static_cast<double>(mine), static_cast<double>(mine), any_began}, at::kDouble);
    const at::Tensor reduced = all_reduce(all, "max");
    oldest = -static_cast<int64_t>(reduced[0].item<double>());
    newest = static_cast<int64_t>(reduced[1].item<double>());
    any_began = reduced[2].item<double>();
  }
  LF_CHECK(oldest == newest, RuntimeError, "fabric.restore_snapshot: the ranks see different newest whole snapshots (",
           oldest, " to ", newest, "; -1: none): the state of some ranks was lost. Restart from a checkpoint on disk.");
  // Every snapshot but `keep` goes, older and newer (a newer one is torn: its next writing must
  // not mix with what is left of it); -1: all of them.
  auto drop_all_but = [&](int64_t keep) {
    connector_->strategy->run_on_every_rank("fabric.restore_snapshot", [&] {
      if (local_rank() != 0) return;
      if (keep >= 0) store->drop_before(kSnapshotPrefix, snapshot_name(keep));
      for (const auto& [number, names] : snapshots)
        if (number > keep) {
          for (const auto& name : names) store->remove(name.empty() ? snapshot_name(number) : snapshot_name(number) + "/" + name);
        }
    });
  };
  if (newest < 0) {
    if (any_began == 0) return false;  // a first start: no snapshot was ever whole
    const std::string what = "fabric.restore_snapshot: snapshots were taken, but none survived whole on the nodes that remain (" +
                             (lost.empty() ? std::string("nothing of them is left") : lost) +
                             "): a node and its buddy node were lost together";
    LF_CHECK(!fallback_checkpoint.empty(), RuntimeError, what,
             ". Pass a checkpoint on disk as restore_snapshot's fallback_checkpoint, or restart from one.");
    if (global_rank() == 0) std::fprintf(stderr, "[lightning-fabric] warning: %s; loading %s instead\n", what.c_str(), fallback_checkpoint.c_str());
    load(fallback_checkpoint, state, /*strict=*/true);  // the program's own checkpoint, as it saved it
    drop_all_but(-1);
    return true;
  }
  if (global_rank() == 0 && !lost.empty()) {  // newer ones, torn by the failure: never loaded
    std::fprintf(stderr, "[lightning-fabric] fabric.restore_snapshot: restoring snapshot %lld, the newest whole one; "
                 "skipped %s\n", static_cast<long long>(newest), lost.c_str());
  }
  const std::string path = "memory://" + snapshot_name(newest);
  State with = with_snapshot_resume(state, "fabric.restore_snapshot");
  load(path, with, /*strict=*/true);
  for (auto& [name, entry] : state) {
    if (entry.kind() == StateEntry::Kind::Value) entry.set_value(with.at(name).value());
  }
  snapshot_calls_ = newest;
  drop_all_but(newest);
  return true;
}

}  // namespace lightning::fabric
