// fsdp checkpoints: fabric.save / fabric.load under the fsdp strategy (docs/checkpoints.md).
// "sharded" writes a folder (layout: checkpoint/sharded_format.h), every shard-holding rank its
// own file, and loads it back on any number of ranks; "full" gathers every tensor and rank 0 writes
// one file. Both go through the strategies' one protocol (Strategy::run_on_rank_zero /
// run_on_every_rank), so a failure anywhere is the same error on every rank.
#include <c10/util/accumulate.h>
#include <torch/types.h>
#include <unistd.h>

#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/checkpoint/sharded.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/fsdp.h"
#include "lightning/fabric/strategies/fsdp_engine.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

namespace {
// Moves a finished folder to `path`, replacing what was there; the old content is deleted only
// once the new folder is in place.
void replace_folder(const fs::path& staging, const fs::path& path) {
  const fs::path previous = path.string() + ".old-" + std::to_string(::getpid());
  const bool had_previous = fs::exists(path);
  if (had_previous) fs::rename(path, previous);
  try {
    fs::rename(staging, path);
  } catch (const fs::filesystem_error&) {
    if (had_previous) fs::rename(previous, path);
    throw;
  }
  std::error_code ignored;
  fs::remove_all(previous, ignored);
}
}  // namespace

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
        module_dict.insert_or_assign(p.name, owns_storage ? p.shard.detach().cpu() : p.shard.detach().cpu().clone());
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

void FSDPStrategy::save_checkpoint(const fs::path& path, const State& state, const StateFilter& filter) {
  const std::string call = "fabric.save(" + path.string() + ")";
  std::map<std::string, std::vector<int64_t>> global_shapes;
  StateDict local = make_state_dict();
  run_on_every_rank(call, [&] { local = engine_->local_checkpoint(state, filter, global_shapes); });
  const int parts = shard_group_size(), part = shard_group_rank();
  if (fsdp_options_.state_dict_type == "full") {
    for (const auto& [tensor_path, shape] : global_shapes) {  // the same order on every rank
      at::Tensor slot = torch::zeros({(c10::multiply_integers(shape) + parts - 1) / parts});
      const at::Tensor mine = tensor_at_path(local, tensor_path);
      slot.narrow(0, 0, mine.numel()).copy_(mine);
      const at::Tensor whole = parts > 1 ? shard_group().all_gather(slot).reshape(-1) : slot;
      insert_at_path(local, tensor_path, whole.narrow(0, 0, c10::multiply_integers(shape)).view(shape).clone());
    }
    run_on_rank_zero(call, [&] { save_state_dict_file(path, local); });
    return;
  }
  // Sharded: every part writes its file into a fresh folder that replaces `path` at the end.
  const fs::path staging =
      broadcast_bytes(is_global_zero() ? path.string() + ".tmp-" + std::to_string(::getpid()) : std::string(), 0);
  run_on_rank_zero(call, [&] {
    fs::remove_all(staging);
    fs::create_directories(staging);
  });
  try {
    run_on_every_rank(call, [&] {
      if (global_rank() < parts) {  // one replica of every part (HYBRID_SHARD: node 0's ranks)
        StateDict shard = make_state_dict();
        for (const auto& [tensor_path, shape] : global_shapes) shard.insert(tensor_path, tensor_at_path(local, tensor_path));
        save_state_dict_file(staging / shard_file_name(part, parts), shard);
      }
      if (is_global_zero()) {
        ShardedLayout layout;
        layout.world_size = world_size();
        layout.parts = parts;
        for (const auto& [tensor_path, shape] : global_shapes) {
          layout.tensors[tensor_path] = {shape, c10::toString(tensor_at_path(local, tensor_path).scalar_type())};
          remove_at_path(local, tensor_path);
        }
        save_state_dict_file(staging / "common.pt", local);
        write_sharded_layout(staging, layout);
      }
    });
  } catch (const RuntimeError&) {
    std::error_code ignored;
    if (is_global_zero()) fs::remove_all(staging, ignored);  // nothing half-written stays behind
    throw;
  }
  run_on_rank_zero(call, [&] { replace_folder(staging, path); });
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
