// Checkpoints of the model_parallel strategy. A split tensor (a tensor-parallel layer's
// parameter, or optimizer state of its shape) is saved as its slices, one box per tensor-group
// rank of data rank 0, in a distributed checkpoint folder, or gathered whole into one file
// ("full"); every other value is saved once, by rank 0. Loading keeps this rank's slice of each
// split tensor, whatever mesh wrote the checkpoint.
#include <ATen/ATen.h>

#include "lightning/fabric/checkpoint/background_write.h"
#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/checkpoint/dcp.h"
#include "lightning/fabric/checkpoint/optimizer_names.h"
#include "lightning/fabric/checkpoint/sharded.h"
#include "lightning/fabric/checkpoint/state_dict.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/model_parallel.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

std::optional<ModelParallelStrategy::SplitSlot> ModelParallelStrategy::split_slot_of(const at::Tensor& parameter) const {
  auto found = split_dims_.find(parameter.unsafeGetTensorImpl());
  if (found == split_dims_.end()) return std::nullopt;
  SplitSlot slot{found->second, parameter.sizes().vec()};
  slot.full_shape[static_cast<size_t>(slot.dim)] *= mesh_->tensor_size();
  return slot;
}

namespace {
// Calls visit(index, parameter) for the optimizer's parameters in index order.
template <class Visit>
void for_each_parameter(torch::optim::Optimizer& optimizer, Visit&& visit) {
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) visit(index++, parameter);
  }
}

bool is_state_of(const c10::IValue& field_name, const c10::IValue& value, c10::IntArrayRef shape) {
  return field_name.toStringRef() != "step" && value.isTensor() && value.toTensor().sizes() == shape;
}
}  // namespace

std::map<std::string, ModelParallelStrategy::SplitSlot> ModelParallelStrategy::split_slots(const State& state,
                                                                                          const StateDict& local) const {
  std::map<std::string, SplitSlot> slots;
  for (const auto& named : state) {  // named, not bound: the lambdas below capture key
    const std::string& key = named.first;
    const StateEntry& entry = named.second;
    if (!local.contains(key) || !local.at(key).isGenericDict()) continue;
    const StateDict dict = local.at(key).toGenericDict();
    if (entry.module() != nullptr) {
      for (const auto& parameter : entry.module()->named_parameters(/*recurse=*/true)) {
        auto slot = split_slot_of(parameter.value());
        if (slot && dict.contains(parameter.key())) slots[key + "/" + parameter.key()] = *slot;
      }
    } else if (entry.optimizer() != nullptr && dict.contains("state")) {
      const auto per_parameter = dict.at("state").toGenericDict();
      for_each_parameter(*entry.optimizer(), [&](int64_t index, const at::Tensor& parameter) {
        auto slot = split_slot_of(parameter);
        auto found = per_parameter.find(index);
        if (!slot || found == per_parameter.end()) return;
        for (const auto& field : found->value().toGenericDict()) {
          if (is_state_of(field.key(), field.value(), parameter.sizes())) {
            slots[key + "/state/" + std::to_string(index) + "/" + field.key().toStringRef()] = *slot;
          }
        }
      });
    }
  }
  return slots;
}

CheckpointWrite ModelParallelStrategy::prepare_checkpoint(const std::string& call, const fs::path& path,
                                                          const State& state, const StateFilter& filter, bool host_copy) {
  StateDict local = make_state_dict();
  std::map<std::string, SplitSlot> slots;
  run_on_every_rank(call, [&] {
    local = to_checkpoint(state, filter);
    slots = split_slots(state, local);
  });
  if (options_.state_dict_type == "sharded") {
    return prepare_dcp_folder(call, path, host_copy,
                              [&](StateDict& rest) { return sharded_save_items(state, local, slots, rest); });
  }
  // Full: rank 0's tensor group gathers its slices (the same order on each of its ranks; the
  // other data replicas hold the same values); rank 0 writes.
  const bool gathers = mesh_ != nullptr && mesh_->tensor_size() > 1 && mesh_->data_rank() == 0;
  for (const auto& [tensor_path, slot] : gathers ? slots : std::map<std::string, SplitSlot>{}) {
    const at::Tensor mine = tensor_at_path(local, tensor_path).contiguous();
    const at::Tensor whole = at::cat(mesh_->tensor_group().all_gather(mine).unbind(0), slot.dim);
    if (is_global_zero()) insert_at_path(local, tensor_path, whole);
  }
  if (host_copy) run_on_rank_zero(call, [&] { local = lightning::fabric::host_copy(local).toGenericDict(); });
  if (!is_global_zero()) return {};
  return {[path, local] { save_state_dict_file(path, local); }, nullptr, nullptr};
}

std::vector<dcp::SaveItem> ModelParallelStrategy::sharded_save_items(const State& state, const StateDict& local,
                                                                     const std::map<std::string, SplitSlot>& slots,
                                                                     StateDict& rest) {
  dcp::SaveRules rules;
  rules.parameter_names = [&](torch::optim::Optimizer& optimizer) { return optimizer_parameter_names(state, optimizer); };
  rules.place_part = [&](const std::string& path, dcp::SaveItem& item) {
    auto slot = slots.find(path);
    if (slot == slots.end()) return;
    const dcp::Box box = slice_box(slot->second);  // this rank's slice: the box its value fills
    item.sharded = true;
    item.global_shape = slot->second.full_shape;
    item.offsets = box.offsets;
  };
  rules.writes_parts = mesh_ == nullptr || mesh_->data_rank() == 0;  // one replica of every slice
  rules.writes_whole = is_global_zero();
  return dcp::collect_save_items(state, local, rules, rest);
}

void ModelParallelStrategy::check_whole_shape(c10::IntArrayRef saved, const SplitSlot& slot, const std::string& what) const {
  std::vector<int64_t> mine = slot.full_shape;
  mine[static_cast<size_t>(slot.dim)] /= mesh_->tensor_size();
  LF_CHECK(saved == c10::IntArrayRef(slot.full_shape), RuntimeError, "fabric.load: '", what, "' has shape ", saved,
           " in the checkpoint, but the model splits it along dimension ", slot.dim, " over the ",
           mesh_->tensor_size(), " ranks of its tensor group, ", c10::IntArrayRef(mine), " each (whole: ",
           c10::IntArrayRef(slot.full_shape), "). The checkpoint comes from another model: load it into the model "
           "it was saved from.");
}

dcp::Box ModelParallelStrategy::slice_box(const SplitSlot& slot) const {
  dcp::Box box{std::vector<int64_t>(slot.full_shape.size(), 0), slot.full_shape};
  const size_t dim = static_cast<size_t>(slot.dim);
  box.sizes[dim] /= mesh_->tensor_size();
  box.offsets[dim] = mesh_->tensor_rank() * box.sizes[dim];
  return box;
}

at::Tensor ModelParallelStrategy::slice_of(const at::Tensor& full, const SplitSlot& slot, const std::string& what) const {
  check_whole_shape(full.sizes(), slot, what);
  const dcp::Box box = slice_box(slot);
  return full.narrow(slot.dim, box.offsets[static_cast<size_t>(slot.dim)], box.sizes[static_cast<size_t>(slot.dim)])
      .clone();
}

StateDict ModelParallelStrategy::load_checkpoint(const fs::path& path, State* state, bool strict) {
  StateDict result = make_state_dict();
  run_on_every_rank("fabric.load(" + path.string() + ")", [&] {
    result = fs::is_directory(path) ? read_folder(path, state, strict) : read_file(path, state, strict);
  });
  return result;
}

StateDict ModelParallelStrategy::read_file(const fs::path& path, State* state, bool strict) {
  StateDict checkpoint = load_state_dict_file(path);
  if (state == nullptr) return checkpoint;
  for (const auto& named : *state) {  // named, not bound: the lambdas below capture key
    const std::string& key = named.first;
    const StateEntry& entry = named.second;
    if (!checkpoint.contains(key) || !checkpoint.at(key).isGenericDict()) continue;
    StateDict dict = checkpoint.at(key).toGenericDict();
    if (entry.module() != nullptr) {
      for (const auto& parameter : entry.module()->named_parameters(/*recurse=*/true)) {
        auto slot = split_slot_of(parameter.value());
        auto saved = dict.find(parameter.key());
        if (!slot || saved == dict.end()) continue;
        dict.insert_or_assign(parameter.key(), slice_of(saved->value().toTensor(), *slot, key + "/" + parameter.key()));
      }
    } else if (entry.optimizer() != nullptr) {
      if (keys_state_by_name(dict)) {
        dict = optimizer_state_by_index(dict, optimizer_parameter_names(*state, *entry.optimizer()), key, strict);
        checkpoint.insert_or_assign(key, dict);
      }
      if (!dict.contains("state")) continue;
      const auto per_parameter = dict.at("state").toGenericDict();
      for_each_parameter(*entry.optimizer(), [&](int64_t index, const at::Tensor& parameter) {
        auto slot = split_slot_of(parameter);
        auto found = per_parameter.find(index);
        if (!slot || found == per_parameter.end()) return;
        auto fields = found->value().toGenericDict();
        for (const auto& field : fields) {
          if (!is_state_of(field.key(), field.value(), slot->full_shape)) continue;  // e.g. step
          fields.insert_or_assign(field.key(), slice_of(field.value().toTensor(), *slot, key));
        }
      });
    }
  }
  return restore_from_checkpoint(*state, checkpoint, strict);
}

StateDict ModelParallelStrategy::read_folder(const fs::path& path, State* state, bool strict) {
  dcp::FolderReader reader(path);
  // "entry/parameter name" of every split parameter, for module and optimizer entries alike.
  std::map<std::string, SplitSlot> slots;
  std::map<std::string, std::vector<std::string>> optimizer_names;
  if (state != nullptr) {
    for (const auto& named : *state) {  // named, not bound: the lambdas below capture key
      const std::string& key = named.first;
      const StateEntry& entry = named.second;
      if (entry.module() != nullptr) {
        for (const auto& parameter : entry.module()->named_parameters(/*recurse=*/true)) {
          if (auto slot = split_slot_of(parameter.value())) slots[key + "/" + parameter.key()] = *slot;
        }
      } else if (entry.optimizer() != nullptr) {
        const auto& names = optimizer_names[key] = optimizer_parameter_names(*state, *entry.optimizer());
        for_each_parameter(*entry.optimizer(), [&](int64_t index, const at::Tensor& parameter) {
          if (auto slot = split_slot_of(parameter)) slots[key + "/" + names[static_cast<size_t>(index)]] = *slot;
        });
      }
    }
  }
  std::vector<dcp::Leaf> leaves;
  for (const std::string& key : reader.metadata().order) {
    const dcp::Item& item = reader.metadata().items.at(key);
    const std::vector<dcp::PathElement> at = item.path.empty() ? std::vector<dcp::PathElement>{{key, -1}} : item.path;
    const SplitSlot* slot = nullptr;
    if (state != nullptr) {
      auto entry = state->find(at[0].key);
      // Only what the state asks for is read: entries it lacks stay on disk.
      if (entry == state->end() || (entry->second.module() == nullptr && entry->second.optimizer() == nullptr)) continue;
      const bool module_tensor = entry->second.module() != nullptr && at.size() == 2;
      const bool optimizer_tensor = dcp::is_optimizer_field(at, "state") && at.size() == 4 && at[3].key != "step";
      if (item.kind == dcp::Item::Kind::Tensor && (module_tensor || optimizer_tensor)) {
        auto found = slots.find(at[0].key + "/" + (module_tensor ? at[1].key : at[2].key));
        if (found != slots.end()) slot = &found->second;
        if (slot && module_tensor) check_whole_shape(item.size, *slot, at[0].key + "/" + at[1].key);
        if (slot && item.size != slot->full_shape) slot = nullptr;  // optimizer state of another shape
      }
    }
    leaves.push_back({at, slot ? c10::IValue(reader.box(key, slice_box(*slot))) : reader.value(key)});
  }
  StateDict loaded = dcp::unflatten_state(leaves);
  if (fs::is_regular_file(path / dcp::kLightningMetaFile)) {
    for (const auto& item : load_state_dict_file(path / dcp::kLightningMetaFile)) loaded.insert_or_assign(item.key(), item.value());
  }
  if (state == nullptr) return loaded;
  for (const auto& [key, names] : optimizer_names) {
    if (!loaded.contains(key) || !loaded.at(key).isGenericDict()) continue;
    loaded.insert_or_assign(key, optimizer_state_by_index(loaded.at(key).toGenericDict(), names, key, strict));
  }
  return restore_from_checkpoint(*state, loaded, strict);
}

}  // namespace lightning::fabric
