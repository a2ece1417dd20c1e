// fsdp checkpoints: fabric.save / fabric.load under the fsdp strategy (docs/checkpoints.md).
// "sharded" writes a torch.distributed.checkpoint folder (layout: checkpoint/dcp_format.h), every
// shard-holding rank its own file, and loads it back on any number of ranks (folders of the
// project's earlier layout, checkpoint/sharded_format.h, still load); "full" gathers every tensor
// and rank 0 writes one file. Both go through the strategies' one protocol (Strategy::run_on_rank_zero /
// run_on_every_rank), so a failure anywhere is the same error on every rank.
#include <c10/util/accumulate.h>
#include <torch/types.h>

#include "lightning/fabric/checkpoint/background_write.h"
#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/checkpoint/dcp.h"
#include "lightning/fabric/checkpoint/optimizer_names.h"
#include "lightning/fabric/checkpoint/sharded.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/fsdp.h"
#include "lightning/fabric/strategies/fsdp_engine.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

StateDict FSDPStrategy::Engine::local_checkpoint(const State& state, const StateFilter& filter,
                                         std::map<std::string, std::vector<int64_t>>& global_shapes) {
  StateDict out = to_checkpoint(state, filter);  // shard tensors in optimizer entries already
  for (const auto& [key, entry] : state) {
    if (entry.module() != nullptr) {
      ShardedModule* sharded = find(*entry.module());
      if (sharded == nullptr) continue;
      StateDict module_dict = out.at(key).toGenericDict();
      for (const auto& p : sharded->parameters) {
        if (!module_dict.contains(p.name)) continue;  // filtered out
        // A shard that views its full parameter (SHARD_GRAD_OP, NO_SHARD) would save the whole storage.
        const bool owns_storage = p.shard.storage().nbytes() == static_cast<size_t>(p.shard.nbytes());
        module_dict.insert_or_assign(p.name, owns_storage ? saved_tensor(p.shard) : saved_tensor(p.shard).clone());
        global_shapes[key + "/" + p.name] = p.shape;
      }
    } else if (entry.optimizer() != nullptr) {
      StateDict optimizer_dict = out.at(key).toGenericDict();
      if (!optimizer_dict.contains("state")) continue;
      const auto per_parameter = optimizer_dict.at("state").toGenericDict();
      int64_t index = 0;
      for (const auto& group : entry.optimizer()->param_groups()) {
        for (const auto& parameter : group.params()) {
          const ShardedParameter* p = find_shard(parameter);
          auto found = per_parameter.find(index);
          if (p != nullptr && found != per_parameter.end()) {
            for (const auto& item : found->value().toGenericDict()) {
              if (item.value().isTensor() && item.value().toTensor().dim() == 1 &&
                  item.value().toTensor().numel() == p->slice.length) {
                global_shapes[key + "/state/" + std::to_string(index) + "/" + item.key().toStringRef()] = p->shape;
              }
            }
          }
          ++index;
        }
      }
    }
  }
  return out;
}

CheckpointWrite FSDPStrategy::prepare_checkpoint(const std::string& call, const fs::path& path, const State& state,
                                                 const StateFilter& filter, bool host_copy) {
  std::map<std::string, std::vector<int64_t>> global_shapes;
  StateDict local = make_state_dict();
  run_on_every_rank(call, [&] { local = engine_->local_checkpoint(state, filter, global_shapes); });
  if (fsdp_options_.state_dict_type != "full") return prepare_sharded_folder(call, path, state, local, global_shapes, host_copy);
  const int parts = shard_group_size();
  for (const auto& [tensor_path, shape] : global_shapes) {  // the same order on every rank
    at::Tensor slot = torch::zeros({(c10::multiply_integers(shape) + parts - 1) / parts});
    const at::Tensor mine = tensor_at_path(local, tensor_path);
    slot.narrow(0, 0, mine.numel()).copy_(mine);
    const at::Tensor whole = parts > 1 ? shard_group().all_gather(slot).reshape(-1) : slot;
    insert_at_path(local, tensor_path, whole.narrow(0, 0, c10::multiply_integers(shape)).view(shape).clone());
  }
  if (host_copy) run_on_rank_zero(call, [&] { local = lightning::fabric::host_copy(local).toGenericDict(); });
  if (!is_global_zero()) return {};
  return {[path, local] { save_state_dict_file(path, local); }, nullptr, nullptr};
}

CheckpointWrite FSDPStrategy::prepare_sharded_folder(const std::string& call, const fs::path& path, const State& state,
                                                     const StateDict& local,
                                                     const std::map<std::string, std::vector<int64_t>>& global_shapes,
                                                     bool host_copy) {
  return prepare_dcp_folder(call, path, host_copy,
                            [&](StateDict& rest) { return sharded_save_items(state, local, global_shapes, rest); });
}

std::vector<dcp::SaveItem> FSDPStrategy::sharded_save_items(
    const State& state, const StateDict& local, const std::map<std::string, std::vector<int64_t>>& global_shapes,
    StateDict& rest) {
  const int parts = shard_group_size(), part = shard_group_rank();
  dcp::SaveRules rules;
  rules.parameter_names = [&](torch::optim::Optimizer& optimizer) {
    return engine_->optimizer_parameter_names(state, optimizer);
  };
  rules.place_part = [&](const std::string& path, dcp::SaveItem& item) {
    auto shape = global_shapes.find(path);
    if (shape == global_shapes.end()) return;
    item.sharded = true;
    item.global_shape = shape->second;
    item.begin = shard_slice(element_count(shape->second), parts, part).begin;
  };
  rules.writes_parts = global_rank() < parts;  // one replica of every part (HYBRID_SHARD: node 0's ranks)
  rules.writes_whole = is_global_zero();
  return dcp::collect_save_items(state, local, rules, rest);
}

// Collective: a rank that cannot read its part fails every rank alike.
StateDict FSDPStrategy::load_checkpoint(const fs::path& path, State* state, bool strict) {
  StateDict result = make_state_dict();
  run_on_every_rank("fabric.load(" + path.string() + ")", [&] { result = read_checkpoint(path, state, strict); });
  return result;
}

StateDict FSDPStrategy::read_checkpoint(const fs::path& path, State* state, bool strict) {
  if (!fs::is_directory(path)) {
    return state ? engine_->restore_local(*state, load_state_dict_file(path), strict, false) : load_state_dict_file(path);
  }
  if (!is_sharded_checkpoint(path)) return read_sharded_folder(path, state, strict);
  // The project's earlier layout (metadata.json, common.pt, shard-R-of-P.pt): read-only.
  if (state == nullptr) return consolidate_sharded_checkpoint(path);
  const ShardedLayout layout = read_sharded_layout(path);
  StateDict local = load_state_dict_file(path / "common.pt");
  std::map<int, StateDict> cache;
  for (const auto& [tensor_path, info] : layout.tensors) {
    insert_at_path(local, tensor_path,
                   read_resharded(path, layout, tensor_path, shard_group_size(), shard_group_rank(), cache));
  }
  return engine_->restore_local(*state, local, strict, true);
}

StateDict FSDPStrategy::read_sharded_folder(const fs::path& path, State* state, bool strict) {
  dcp::FolderReader reader(path);
  // Per optimizer entry: its state's parameter names and the shard behind each.
  std::map<std::string, std::vector<std::string>> optimizer_names;
  std::map<std::string, std::map<std::string, const Engine::ShardedParameter*>> optimizer_shards;
  if (state != nullptr) {
    for (const auto& [key, entry] : *state) {
      if (entry.optimizer() == nullptr) continue;
      const auto& names = optimizer_names[key] = engine_->optimizer_parameter_names(*state, *entry.optimizer());
      size_t index = 0;
      for (const auto& group : entry.optimizer()->param_groups()) {
        for (const auto& parameter : group.params()) optimizer_shards[key][names[index++]] = engine_->find_shard(parameter);
      }
    }
  }
  std::vector<dcp::Leaf> leaves;
  for (const std::string& key : reader.metadata().order) {
    const dcp::Item& item = reader.metadata().items.at(key);
    const std::vector<dcp::PathElement> at = item.path.empty() ? std::vector<dcp::PathElement>{{key, -1}} : item.path;
    const Engine::ShardedParameter* p = nullptr;
    if (state != nullptr) {
      auto entry = state->find(at[0].key);
      // Only what the state asks for is read: entries it lacks stay on disk.
      if (entry == state->end() || (entry->second.module() == nullptr && entry->second.optimizer() == nullptr)) continue;
      if (item.kind == dcp::Item::Kind::Tensor && entry->second.module() != nullptr && at.size() == 2) {
        p = engine_->sharded_parameter(*state, entry->first, at[1].key);
      } else if (item.kind == dcp::Item::Kind::Tensor && dcp::is_optimizer_field(at, "state") && at.size() == 4 &&
                 at[3].key != "step") {  // a per-parameter count, never sharded, whatever its shape
        auto& shards = optimizer_shards[entry->first];
        auto found = shards.find(at[2].key);
        p = found == shards.end() ? nullptr : found->second;
      }
      if (p != nullptr && item.size != p->shape) p = nullptr;  // state of another shape than its parameter
    }
    leaves.push_back({at, p ? c10::IValue(reader.flat_range(key, p->slice.begin, p->slice.length)) : reader.value(key)});
  }
  StateDict loaded = dcp::unflatten_state(leaves);
  if (fs::is_regular_file(path / dcp::kLightningMetaFile)) {
    for (const auto& item : load_state_dict_file(path / dcp::kLightningMetaFile)) loaded.insert_or_assign(item.key(), item.value());
  }
  if (state == nullptr) return loaded;
  for (const auto& [key, entry] : *state) {
    if (entry.optimizer() == nullptr || !loaded.contains(key) || !loaded.at(key).isGenericDict()) continue;
    loaded.insert_or_assign(key, optimizer_state_by_index(loaded.at(key).toGenericDict(), optimizer_names[key], key, strict));
  }
  return engine_->restore_local(*state, loaded, strict, true);
}

std::vector<std::string> FSDPStrategy::Engine::optimizer_parameter_names(const State& state,
                                                                        torch::optim::Optimizer& optimizer) const {
  const std::vector<std::string> in_modules = lightning::fabric::optimizer_parameter_names(state, optimizer);
  size_t index = 0;
  return lightning::fabric::optimizer_parameter_names(optimizer, [&](const at::Tensor& parameter) -> std::optional<std::string> {
    const ShardedParameter* p = find_shard(parameter);
    const std::string& fallback = in_modules[index++];
    return p ? p->name : fallback;
  });
}

const FSDPStrategy::Engine::ShardedParameter* FSDPStrategy::Engine::sharded_parameter(const State& state, const std::string& entry,
                                                                                     const std::string& name) {
  for (const auto& [key, candidate] : state) {
    if (candidate.module() == nullptr || (!entry.empty() && key != entry)) continue;
    if (ShardedModule* sharded = find(*candidate.module())) {
      for (const auto& p : sharded->parameters) {
        if (p.name == name) return &p;
      }
    }
  }
  return nullptr;
}

StateDict FSDPStrategy::Engine::restore_local(State& state, const StateDict& checkpoint, bool strict, bool tensors_are_local) {
  const int parts = strategy_.shard_group_size(), part = strategy_.shard_group_rank();
  torch::NoGradGuard no_grad;
  auto restore_sharded = [&](const std::string& key, StateEntry& entry, const c10::IValue& saved) {
    ShardedModule* sharded = entry.module() != nullptr ? find(*entry.module()) : nullptr;
    if (sharded != nullptr) {
      StateDict values = saved.toGenericDict();
      for (auto& p : sharded->parameters) {
        auto value = values.find(p.name);
        LF_CHECK(value != values.end() || !strict, RuntimeError, "load(strict=true): the checkpoint's '", key,
                 "' lacks parameter ", p.name, ".");
        if (value == values.end()) continue;
        const at::Tensor tensor = value->value().toTensor();
        LF_CHECK(tensors_are_local || tensor.numel() == p.numel, RuntimeError, "load: '", key, "/", p.name, "' has ",
                 tensor.numel(), " elements in the checkpoint but ", p.numel, " in the module.");
        p.shard.copy_(tensors_are_local ? tensor.reshape(-1) : slice_for_part(tensor, parts, part));
      }
      for (auto& buffer : entry.module()->named_buffers(true)) {
        auto value = values.find(buffer.key());
        if (value != values.end()) buffer.value().copy_(value->value().toTensor());
      }
      settle_prefetch(/*use=*/false);  // gathered before the load
      ++shard_version_;
      for (auto& unit : sharded->units) unit.stale = true;  // the next forward gathers the restored shards
      return true;
    }
    if (entry.optimizer() == nullptr || tensors_are_local) return false;
    // A whole checkpoint: slice each parameter's state to this rank's shard.
    StateDict values = saved.toGenericDict();
    if (keys_state_by_name(values)) values = optimizer_state_by_index(values, optimizer_parameter_names(state, *entry.optimizer()), key, strict);
    if (values.contains("state")) {
      auto per_parameter = values.at("state").toGenericDict();
      int64_t index = 0;
      for (const auto& group : entry.optimizer()->param_groups()) {
        for (const auto& parameter : group.params()) {
          const ShardedParameter* p = find_shard(parameter);
          auto slot = per_parameter.find(index++);
          if (p == nullptr || slot == per_parameter.end()) continue;
          auto param_state = slot->value().toGenericDict();
          for (const auto& field : param_state) {
            if (field.value().isTensor() && field.value().toTensor().dim() >= 1 &&
                field.value().toTensor().numel() == p->numel) {
              param_state.insert_or_assign(field.key(), slice_for_part(field.value().toTensor(), parts, part));
            }
          }
        }
      }
    }
    load_optimizer_state_dict(*entry.optimizer(), values);
    return true;
  };
  return restore_from_checkpoint(state, checkpoint, strict, restore_sharded);
}

}  // namespace lightning::fabric
