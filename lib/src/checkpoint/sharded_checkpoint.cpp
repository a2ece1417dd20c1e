// The sharded-checkpoint engine (sharded_checkpoint.h): saves and loads for every sharded
// strategy, from the placements its CheckpointLayout gives.
#include "lightning/fabric/checkpoint/sharded_checkpoint.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "lightning/fabric/checkpoint/atomic_file.h"
#include "lightning/fabric/checkpoint/background_write.h"
#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/checkpoint/checkpoint_storage.h"
#include "lightning/fabric/checkpoint/checkpoint_peers.h"
#include "lightning/fabric/checkpoint/dcp.h"
#include "lightning/fabric/checkpoint/optimizer_names.h"
#include "lightning/fabric/checkpoint/sharded.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

std::vector<std::string> CheckpointLayout::optimizer_parameter_names(const State& state,
                                                                     torch::optim::Optimizer& optimizer) const {
  return lightning::fabric::optimizer_parameter_names(state, optimizer);
}

int64_t CheckpointLayout::parameter_position(const State&, const std::string&) const { return 0; }

StateDict CheckpointLayout::restore(State& state, const StateDict& local, bool strict) {
  return restore_from_checkpoint(state, local, strict);
}

namespace {
using Placements = std::map<std::string, Placement>;  // by slash path

// Calls visit(index, parameter) for the optimizer's parameters in index order.
template <class Visit>
void for_each_optimizer_parameter(torch::optim::Optimizer& optimizer, Visit&& visit) {
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) visit(index++, parameter);
  }
}

// Per-parameter optimizer state shaped like the parameter's value shares its placement; "step"
// is a count, whatever its shape.
bool is_state_shaped_like(const c10::IValue& field_name, const c10::IValue& value, c10::IntArrayRef shape) {
  return field_name.toStringRef() != "step" && value.isTensor() && value.toTensor().sizes() == shape;
}

bool is_whole_box(const Placement& placement) {
  for (int64_t offset : placement.box.offsets) {
    if (offset != 0) return false;
  }
  return placement.box.sizes == placement.global_shape;
}

// Replaces each placed module parameter of `local` (to_checkpoint of state) by the value this rank
// saves, and returns the placement of every placed tensor, optimizer state by index.
Placements place_local(const State& state, StateDict& local, const CheckpointLayout& layout) {
  Placements placements;
  for (const auto& named : state) {  // named, not bound: the lambda below captures key
    const std::string& key = named.first;
    const StateEntry& entry = named.second;
    if (!local.contains(key) || !local.at(key).isGenericDict()) continue;
    StateDict dict = local.at(key).toGenericDict();  // shares its storage with local's
    if (entry.module() != nullptr) {
      for (const auto& parameter : entry.module()->named_parameters(/*recurse=*/true)) {
        if (!dict.contains(parameter.key())) continue;  // filtered out
        auto placement = layout.placement(parameter.value());
        if (!placement) continue;
        dict.insert_or_assign(parameter.key(), saved_tensor(layout.saved_value(parameter.value())));
        placements[key + "/" + parameter.key()] = *placement;
      }
      for (const auto& buffer : entry.module()->named_buffers(/*recurse=*/true)) {
        if (!dict.contains(buffer.key())) continue;
        if (auto placement = layout.placement(buffer.value())) placements[key + "/" + buffer.key()] = *placement;
      }
    } else if (entry.optimizer() != nullptr && dict.contains("state")) {
      const auto per_parameter = dict.at("state").toGenericDict();
      for_each_optimizer_parameter(*entry.optimizer(), [&](int64_t index, const at::Tensor& parameter) {
        auto found = per_parameter.find(index);
        if (found == per_parameter.end()) return;
        auto placement = layout.placement(parameter);
        if (!placement) return;
        for (const auto& field : found->value().toGenericDict()) {
          if (is_state_shaped_like(field.key(), field.value(), placement->local_shape())) {
            placements[key + "/state/" + std::to_string(index) + "/" + field.key().toStringRef()] = *placement;
          }
        }
      });
    }
  }
  return placements;
}

// ---- a folder's optimizer groups where ranks hold only some parameters ----

using GroupNames = std::vector<std::vector<std::string>>;  // each group's parameter names

// This rank's optimizer groups, for merge_groups: per optimizer entry of state that local
// holds, each group's parameters as (position in the whole model, name), as text.
std::string encode_groups(const State& state, const StateDict& local, const CheckpointLayout& layout) {
  std::string out;
  const auto text = [&out](const std::string& value) { out += std::to_string(value.size()) + ':' + value; };
  const auto number = [&out](int64_t value) { out += std::to_string(value) + ' '; };
  for (const auto& [key, entry] : state) {
    if (entry.optimizer() == nullptr || !local.contains(key)) continue;
    torch::optim::Optimizer& optimizer = *entry.optimizer();
    const std::vector<std::string> names = layout.optimizer_parameter_names(state, optimizer);
    text(key);
    number(static_cast<int64_t>(optimizer.param_groups().size()));
    size_t index = 0;
    for (const auto& group : optimizer.param_groups()) {
      number(static_cast<int64_t>(group.params().size()));
      for (size_t k = 0; k < group.params().size(); ++k, ++index) {
        number(layout.parameter_position(state, names[index]));
        text(names[index]);
      }
    }
  }
  return out;
}

// Reads what encode_groups wrote.
class GroupsReader {
 public:
  GroupsReader(const std::string& bytes, int rank) : bytes_(bytes), rank_(rank) {}
  bool done() const { return at_ >= bytes_.size(); }
  int64_t number() { return std::stoll(next(' ')); }
  std::string text() {
    const size_t length = std::stoull(next(':'));
    check(at_ + length <= bytes_.size());
    std::string value = bytes_.substr(at_, length);
    at_ += length;
    return value;
  }

 private:
  std::string next(char end) {
    const size_t found = bytes_.find(end, at_);
    check(found != std::string::npos && found > at_);
    std::string value = bytes_.substr(at_, found - at_);
    at_ = found + 1;
    return value;
  }
  void check(bool ok) const {
    LF_CHECK(ok, RuntimeError, "the optimizer groups rank ", rank_, " sent for the checkpoint are malformed at byte ", at_,
             " of ", bytes_.size(), ": the ranks run different builds of the library. Run one build on every rank.");
  }
  const std::string& bytes_;
  size_t at_ = 0;
  int rank_;
};

// Each optimizer entry's groups from every rank's encode_groups (by rank): a group lists every
// rank's parameters of it, each name once, sorted by position (equal positions in rank order,
// then in the group's).
std::map<std::string, GroupNames> merge_groups(const std::vector<std::string>& every_rank) {
  struct Named {
    int64_t position;
    std::string name;
  };
  std::map<std::string, std::vector<std::vector<Named>>> gathered;
  for (size_t rank = 0; rank < every_rank.size(); ++rank) {
    GroupsReader reader(every_rank[rank], static_cast<int>(rank));
    while (!reader.done()) {
      std::vector<std::vector<Named>>& groups = gathered[reader.text()];
      const int64_t count = reader.number();
      if (static_cast<int64_t>(groups.size()) < count) groups.resize(static_cast<size_t>(count));
      for (int64_t g = 0; g < count; ++g) {
        const int64_t parameters = reader.number();
        for (int64_t k = 0; k < parameters; ++k) {
          const int64_t position = reader.number();
          groups[static_cast<size_t>(g)].push_back({position, reader.text()});
        }
      }
    }
  }
  std::map<std::string, GroupNames> merged;
  for (auto& [key, groups] : gathered) {
    GroupNames& out = merged[key];
    for (std::vector<Named>& group : groups) {
      std::stable_sort(group.begin(), group.end(), [](const Named& a, const Named& b) { return a.position < b.position; });
      std::set<std::string> seen;
      std::vector<std::string> names;
      for (const Named& named : group) {
        if (seen.insert(named.name).second) names.push_back(named.name);
      }
      out.push_back(std::move(names));
    }
  }
  return merged;
}

// A folder. On disk: rank 0 stages it, every rank writes its items (write), rank 0 merges the
// metadata and renames the folder into place (commit). On s3://: every rank stages its part in a
// local temporary folder and uploads it (write); rank 0 uploads meta.pt and .metadata last
// (commit, checkpoint_storage.h).
CheckpointWrite prepare_folder(const CheckpointPeers& peers, const std::string& call, const fs::path& path, bool host_copy,
                               const std::function<std::vector<dcp::SaveItem>(StateDict& rest)>& collect) {
  const bool zero = peers.is_global_zero();
  std::shared_ptr<const checkpoint_storage::RemoteFolder> remote;
  std::shared_ptr<checkpoint_storage::TemporaryFolder> local_part;  // s3://: this rank's staging
  fs::path staging;
  std::string part = dcp::data_file_name(peers.global_rank());
  storage::refuse_unknown_schemes(path.string(), call);
  if (checkpoint_storage::is_remote(path)) {
    std::string renamed;  // over an earlier save: parts under new names, so the earlier stays whole until the commit
    peers.run_on_every_rank(call, [&] {
      remote = std::make_shared<const checkpoint_storage::RemoteFolder>(path, call);
      local_part = std::make_shared<checkpoint_storage::TemporaryFolder>("checkpoint-save", remote->stages_in_memory());
    });
    peers.run_on_rank_zero(call, [&] { renamed = remote->part_suffix(); });
    renamed = peers.broadcast_bytes(renamed, 0);
    staging = local_part->path();
    if (!renamed.empty()) part = part.substr(0, part.size() - 7) + renamed + ".distcp";
  } else {
    staging = peers.broadcast_bytes(zero ? path.string() + ".tmp-" + std::to_string(::getpid()) : std::string(), 0);
    peers.run_on_rank_zero(call, [&] {
      fs::remove_all(staging);
      fs::create_directories(staging);
    });
  }
  // s3://: the uploaded parts stay (without this save's .metadata they never load; the next save
  // there removes them), since a failure after the commit point must not remove what it names.
  auto discard = [zero, staging, remote, local_part] {
    std::error_code ignored;
    if (!remote && zero) fs::remove_all(staging, ignored);  // nothing half-written stays behind
  };
  auto items = std::make_shared<std::vector<dcp::SaveItem>>();
  auto rest = std::make_shared<StateDict>(make_state_dict());  // what Python Fabric keeps in meta.pt
  try {
    peers.run_on_every_rank(call, [&] {
      *items = collect(*rest);
      if (!host_copy) return;
      for (dcp::SaveItem& item : *items) item.value = lightning::fabric::host_copy(item.value);
      *rest = lightning::fabric::host_copy(*rest).toGenericDict();
    });
  } catch (const RuntimeError&) {
    discard();
    throw;
  }
  auto written = std::make_shared<std::string>();  // this rank's metadata, pickled
  CheckpointWrite steps;
  steps.write = [staging, items, written, remote, part] {
    *written = dcp::write_metadata(dcp::write_rank_items(staging, part, *items));
    if (remote && fs::exists(staging / part)) {
      remote->upload(staging / part);
      fs::remove(staging / part);
    }
  };
  steps.commit = [peers, call, staging, path, rest, written, remote, local_part] {
    const std::vector<std::string> every_rank = peers.gather_bytes(*written);
    peers.run_on_rank_zero(call, [&] {
      std::vector<dcp::Metadata> parts;
      for (size_t rank = 0; rank < every_rank.size(); ++rank) {
        parts.push_back(dcp::parse_metadata(every_rank[rank], "rank " + std::to_string(rank) + "'s items"));
      }
      const dcp::Metadata merged = dcp::merge_metadata(parts);
      save_state_dict_file(staging / dcp::kLightningMetaFile, *rest);
      write_file_atomically(staging / dcp::kMetadataFile, dcp::write_metadata(merged));
      if (!remote) return replace_folder(staging, path, dcp::kMetadataFile);
      std::set<std::string> files;
      for (const auto& [key, item] : merged.items)
        for (const auto& location : item.locations) files.insert(location.file);
      remote->commit(staging / dcp::kLightningMetaFile, staging / dcp::kMetadataFile, files);
    });
  };
  steps.discard = discard;
  return steps;
}

// The placement of every placed parameter of state's module and optimizer entries, keyed
// "entry/<parameter name>" for a module's and "entry/<optimizer_key(entry, index)>" for an optimizer's.
Placements parameter_placements(const State& state, const CheckpointLayout& layout,
                                const std::function<std::string(const std::string& entry, int64_t index)>& optimizer_key) {
  Placements placements;
  for (const auto& named : state) {  // named, not bound: the lambda below captures key
    const std::string& key = named.first;
    const StateEntry& entry = named.second;
    if (entry.module() != nullptr) {
      for (const auto& parameter : entry.module()->named_parameters(/*recurse=*/true)) {
        if (auto placement = layout.placement(parameter.value())) placements[key + "/" + parameter.key()] = *placement;
      }
    } else if (entry.optimizer() != nullptr) {
      for_each_optimizer_parameter(*entry.optimizer(), [&](int64_t index, const at::Tensor& parameter) {
        if (auto placement = layout.placement(parameter)) placements[key + "/" + optimizer_key(key, index)] = *placement;
      });
    }
  }
  return placements;
}

// For a layout whose ranks hold only some tensors (every_rank_holds_every_tensor false): drops
// what the checkpoint holds for tensors this rank's state lacks (other stages' parameters,
// buffers and optimizer state) and lists, in each optimizer group, this rank's parameters of that
// group with the hyperparameters as saved (one optimizer over the whole model gives every rank
// the same groups). Optimizer state keyed by name is kept so; by index is left as it is.
void keep_what_this_rank_holds(const State& state, StateDict& loaded, const CheckpointLayout& layout) {
  if (layout.every_rank_holds_every_tensor()) return;
  for (const auto& [key, entry] : state) {
    if (!loaded.contains(key) || !loaded.at(key).isGenericDict()) continue;
    StateDict dict = make_state_dict();
    for (const auto& item : loaded.at(key).toGenericDict()) dict.insert(item.key(), item.value());
    if (entry.module() != nullptr) {
      std::set<std::string> held;
      for (const auto& item : entry.module()->named_parameters(/*recurse=*/true)) held.insert(item.key());
      for (const auto& item : entry.module()->named_buffers(/*recurse=*/true)) held.insert(item.key());
      StateDict kept = make_state_dict();
      for (const auto& item : dict) {
        if (held.count(item.key().toStringRef())) kept.insert(item.key(), item.value());
      }
      loaded.insert_or_assign(key, kept);
    } else if (entry.optimizer() != nullptr && (!dict.contains("state") || keys_state_by_name(dict))) {
      // (no "state": an optimizer without per-parameter state, e.g. SGD without momentum)
      torch::optim::Optimizer& optimizer = *entry.optimizer();
      const std::vector<std::string> names = layout.optimizer_parameter_names(state, optimizer);
      const std::set<std::string> held(names.begin(), names.end());
      if (dict.contains("state")) {
        const auto all = dict.at("state").toGenericDict();
        c10::impl::GenericDict kept(all.keyType(), all.valueType());
        for (const auto& item : all) {
          if (!item.key().isString() || held.count(item.key().toStringRef())) kept.insert(item.key(), item.value());
        }
        dict.insert_or_assign("state", kept);
      }
      if (dict.contains("param_groups") && dict.at("param_groups").isList()) {
        c10::impl::GenericList groups(c10::AnyType::get());
        size_t next = 0, g = 0;
        for (const c10::IValue group : dict.at("param_groups").toList()) {
          StateDict copy = make_state_dict();
          for (const auto& item : group.toGenericDict()) copy.insert(item.key(), item.value());
          c10::List<std::string> params;
          const size_t count = g < optimizer.param_groups().size() ? optimizer.param_groups()[g].params().size() : 0;
          for (size_t k = 0; k < count && next < names.size(); ++k) params.push_back(names[next++]);
          copy.insert_or_assign("params", params);
          groups.push_back(copy);
          ++g;
        }
        dict.insert_or_assign("param_groups", groups);
      }
      loaded.insert_or_assign(key, dict);
    }
  }
}

StateDict read_whole_file(const fs::path& path, State* state, bool strict, CheckpointLayout& layout) {
  StateDict checkpoint = load_state_dict_file(path);
  if (state == nullptr) return checkpoint;
  keep_what_this_rank_holds(*state, checkpoint, layout);
  for (const auto& named : *state) {  // named, not bound: the lambda below captures key
    const std::string& key = named.first;
    const StateEntry& entry = named.second;
    if (!checkpoint.contains(key) || !checkpoint.at(key).isGenericDict()) continue;
    StateDict dict = checkpoint.at(key).toGenericDict();
    if (entry.module() != nullptr) {
      for (const auto& parameter : entry.module()->named_parameters(/*recurse=*/true)) {
        auto placement = layout.placement(parameter.value());
        auto saved = dict.find(parameter.key());
        if (!placement || saved == dict.end() || !saved->value().isTensor()) continue;
        dict.insert_or_assign(parameter.key(),
                              part_of_whole(saved->value().toTensor(), *placement, key + "/" + parameter.key()));
      }
    } else if (entry.optimizer() != nullptr) {
      if (keys_state_by_name(dict)) {
        dict = optimizer_state_by_index(dict, layout.optimizer_parameter_names(*state, *entry.optimizer()), key, strict);
        checkpoint.insert_or_assign(key, dict);
      }
      if (!dict.contains("state")) continue;
      const auto per_parameter = dict.at("state").toGenericDict();
      for_each_optimizer_parameter(*entry.optimizer(), [&](int64_t index, const at::Tensor& parameter) {
        auto placement = layout.placement(parameter);
        auto found = per_parameter.find(index);
        if (!placement || found == per_parameter.end()) return;
        auto fields = found->value().toGenericDict();
        for (const auto& field : fields) {
          if (!is_state_shaped_like(field.key(), field.value(), placement->global_shape)) continue;  // e.g. step
          fields.insert_or_assign(field.key(), part_of_whole(field.value().toTensor(), *placement, key));
        }
      });
    }
  }
  return layout.restore(*state, checkpoint, strict);
}

StateDict read_dcp_folder(const fs::path& path, State* state, bool strict, CheckpointLayout& layout) {
  dcp::FolderReader reader(path);
  std::map<std::string, std::vector<std::string>> optimizer_names;
  Placements by_name;  // "entry/parameter name", for module and optimizer entries alike
  if (state != nullptr) {
    for (const auto& [key, entry] : *state) {
      if (entry.optimizer() != nullptr) optimizer_names[key] = layout.optimizer_parameter_names(*state, *entry.optimizer());
    }
    by_name = parameter_placements(*state, layout, [&](const std::string& key, int64_t index) {
      return optimizer_names.at(key)[static_cast<size_t>(index)];
    });
  }
  std::vector<dcp::Leaf> leaves;
  for (const std::string& key : reader.metadata().order) {
    const dcp::Item& item = reader.metadata().items.at(key);
    const std::vector<dcp::PathElement> at = item.path.empty() ? std::vector<dcp::PathElement>{{key, -1}} : item.path;
    const Placement* placement = nullptr;
    if (state != nullptr) {
      auto entry = state->find(at[0].key);
      // Only what the state asks for is read: entries it lacks stay on disk.
      if (entry == state->end() || (entry->second.module() == nullptr && entry->second.optimizer() == nullptr)) continue;
      const bool module_tensor = entry->second.module() != nullptr && at.size() == 2;
      const bool optimizer_tensor = dcp::is_optimizer_field(at, "state") && at.size() == 4 && at[3].key != "step";
      if (item.kind == dcp::Item::Kind::Tensor && (module_tensor || optimizer_tensor)) {
        auto found = by_name.find(at[0].key + "/" + (module_tensor ? at[1].key : at[2].key));
        if (found != by_name.end()) placement = &found->second;
        if (placement && module_tensor) check_global_shape(item.size, *placement, at[0].key + "/" + at[1].key);
        if (placement && item.size != placement->global_shape) placement = nullptr;  // optimizer state of another shape
      }
    }
    leaves.push_back({at, placement ? c10::IValue(reader.part(key, *placement)) : reader.value(key)});
  }
  StateDict loaded = dcp::unflatten_state(leaves);
  if (fs::is_regular_file(path / dcp::kLightningMetaFile)) {
    for (const auto& item : load_state_dict_file(path / dcp::kLightningMetaFile)) loaded.insert_or_assign(item.key(), item.value());
  }
  if (state == nullptr) return loaded;
  keep_what_this_rank_holds(*state, loaded, layout);
  for (const auto& [key, names] : optimizer_names) {
    if (!loaded.contains(key) || !loaded.at(key).isGenericDict()) continue;
    loaded.insert_or_assign(key, optimizer_state_by_index(loaded.at(key).toGenericDict(), names, key, strict));
  }
  return layout.restore(*state, loaded, strict);
}

// The project's earlier sharded layout (sharded_format.h): read-only.
StateDict read_earlier_layout(const fs::path& path, State* state, bool strict, CheckpointLayout& layout) {
  if (state == nullptr) return consolidate_sharded_checkpoint(path);
  // Module parameters as "entry/name", optimizer parameters as "entry/state/<index>".
  const Placements by_path = parameter_placements(*state, layout, [](const std::string&, int64_t index) {
    return "state/" + std::to_string(index);
  });
  const ShardedLayout earlier = read_sharded_layout(path);
  StateDict local = load_state_dict_file(path / "common.pt");
  std::map<int, StateDict> cache;
  for (const auto& [tensor_path, info] : earlier.tensors) {
    auto found = by_path.find(tensor_path);
    if (found == by_path.end()) found = by_path.find(tensor_path.substr(0, tensor_path.rfind('/')));  // optimizer state
    const Placement* placement = found == by_path.end() || found->second.global_shape != info.shape ? nullptr : &found->second;
    at::Tensor value;
    if (placement != nullptr && placement->flat && is_whole_box(*placement)) {
      value = read_resharded(path, earlier, tensor_path, *placement->flat, cache);
    } else {
      value = read_resharded(path, earlier, tensor_path, ShardSlice{0, info.numel()}, cache).view(info.shape);
      if (placement != nullptr) value = part_of_whole(value, *placement, tensor_path);
    }
    insert_at_path(local, tensor_path, value);
  }
  return layout.restore(*state, local, strict);
}
}  // namespace

CheckpointWrite prepare_sharded_save(Collective& group, const std::string& call, const fs::path& path,
                                     const State& state, const StateFilter& filter, bool host_copy,
                                     const CheckpointLayout& layout, bool one_file) {
  const CheckpointPeers peers(group);
  StateDict local = make_state_dict();
  Placements placements;
  // Where a rank holds only some parameters, its optimizer groups list only those: every rank's
  // are gathered, so that the folder's groups list the whole model's.
  const bool gather_groups = !one_file && !layout.every_rank_holds_every_tensor();
  std::string my_groups;
  peers.run_on_every_rank(call, [&] {
    local = to_checkpoint(state, filter);
    placements = place_local(state, local, layout);
    if (gather_groups) my_groups = encode_groups(state, local, layout);
  });
  std::map<std::string, GroupNames> every_rank_groups;
  if (gather_groups) {
    const std::vector<std::string> every_rank = peers.gather_bytes(my_groups, /*everywhere=*/true);
    peers.run_on_every_rank(call, [&] { every_rank_groups = merge_groups(every_rank); });
  }
  if (!one_file) {
    return prepare_folder(peers, call, path, host_copy, [&](StateDict& rest) {
      dcp::SaveRules rules;
      rules.group_params = every_rank_groups;
      rules.parameter_names = [&](torch::optim::Optimizer& optimizer) {
        return layout.optimizer_parameter_names(state, optimizer);
      };
      rules.place = [&](const std::string& slash_path) -> std::optional<Placement> {
        auto found = placements.find(slash_path);
        return found == placements.end() ? std::nullopt : std::optional<Placement>(found->second);
      };
      rules.writes_whole = layout.every_rank_holds_every_tensor() ? peers.is_global_zero() : layout.writes_unplaced();
      return dcp::collect_save_items(state, local, rules, rest);
    });
  }
  // One file: each placed tensor assembled whole, one at a time and in the same order on every
  // rank: the ranks that write a part put it in place in zeros, and a sum over every rank leaves
  // each element from its one writer.
  for (const auto& [tensor_path, placement] : placements) {
    const at::Tensor mine = tensor_at_path(local, tensor_path);
    at::Tensor whole = at::zeros(placement.global_shape, mine.options());
    if (placement.writes) place_into_whole(whole, placement, mine);
    if (peers.world_size() > 1) peers.all_reduce_sum_(whole);
    if (peers.is_global_zero()) insert_at_path(local, tensor_path, whole);
  }
  if (host_copy) peers.run_on_rank_zero(call, [&] { local = lightning::fabric::host_copy(local).toGenericDict(); });
  if (!peers.is_global_zero()) return {};
  return {[path, local] { save_state_dict_file(path, local); }, nullptr, nullptr};
}

StateDict load_sharded(Collective& group, const fs::path& remote_or_local, State* state, bool strict,
                       CheckpointLayout& layout) {
  const CheckpointPeers peers(group);
  StateDict result = make_state_dict();
  const std::string call = "fabric.load(" + remote_or_local.string() + ")";
  peers.run_on_every_rank(call, [&] {
    result = checkpoint_storage::read_checkpoint(remote_or_local, call, [&](const fs::path& path) {  // s3://: downloaded first
      if (!fs::is_directory(path)) return read_whole_file(path, state, strict, layout);
      if (is_sharded_checkpoint(path)) return read_earlier_layout(path, state, strict, layout);
      return read_dcp_folder(path, state, strict, layout);
    });
  });
  return result;
}

}  // namespace lightning::fabric
